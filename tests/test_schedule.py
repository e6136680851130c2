"""Learning-rate schedules and the fp16 loss scaler."""

import math

import pytest

from meshlm.config.schema import ScheduleConfig
from meshlm.train.precision import DynamicLossScaler
from meshlm.train.schedule import lr_at


def test_warmup_then_cosine_to_min():
    cfg = ScheduleConfig(name="cosine", warmup_steps=10, min_lr_ratio=0.1)
    lrs = [lr_at(s, 1.0, 100, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10]))  # rising warmup
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # monotone decay
    assert lrs[-1] == pytest.approx(0.1)
    mid = 10 + (99 - 10) / 2
    assert lr_at(int(mid), 1.0, 100, cfg) == pytest.approx(0.55, abs=0.02)


def test_wsd_holds_then_decays_linearly():
    cfg = ScheduleConfig(name="wsd", warmup_steps=0, min_lr_ratio=0.0, decay_fraction=0.2)
    lrs = [lr_at(s, 2.0, 100, cfg) for s in range(100)]
    assert lrs[:80] == [2.0] * 80
    assert lrs[-1] == pytest.approx(0.0)
    diffs = [a - b for a, b in zip(lrs[80:], lrs[81:])]
    assert max(diffs) == pytest.approx(min(diffs))  # linear


def test_constant():
    cfg = ScheduleConfig(name="constant", warmup_steps=2)
    assert [lr_at(s, 1.0, 10, cfg) for s in range(4)] == [0.5, 1.0, 1.0, 1.0]


def test_loss_scaler_backs_off_and_grows():
    scaler = DynamicLossScaler(init_scale=1024.0, growth_interval=3)
    assert scaler.update(math.inf) is True and scaler.scale == 512.0
    assert scaler.update(math.nan) is True and scaler.scale == 256.0
    assert [scaler.update(1.0) for _ in range(3)] == [False] * 3
    assert scaler.scale == 512.0
    restored = DynamicLossScaler()
    restored.load_state_dict(scaler.state_dict())
    assert restored.state_dict() == scaler.state_dict() == {"scale": 512.0, "good_steps": 3, "skipped_steps": 2}
