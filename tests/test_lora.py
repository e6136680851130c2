"""LoRA adapters (meshlm/models/lora.py): the adapted model starts equal to the base, only adapters train, the
base stays bitwise unchanged, merging is exact, and the PEFT export gives transformers+peft the same logits as
meshlm's merged model."""

from __future__ import annotations

import pytest
import torch

from meshlm.models import build_model, flavor_config
from meshlm.models.lora import (
    apply_lora,
    expected_lora_params,
    lora_modules,
    merge_lora,
    num_trainable_params,
    reset_lora_parameters,
)

TARGETS = ["q", "k", "v", "o", "gate", "up", "down"]


def _lora_model(targets=TARGETS, rank=4, alpha=8.0, seed=0):
    cfg = flavor_config("debug")
    model = build_model(cfg, "cpu", seed=seed)
    apply_lora(model, targets, rank, alpha, dropout=0.0)
    reset_lora_parameters(model, seed)
    return cfg, model


def _randomise_b(model, seed=1):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in lora_modules(model).values():
            module.lora_B.copy_(torch.randn(module.lora_B.shape, generator=gen) * 0.05)


@pytest.mark.parametrize("targets", [["q", "v"], TARGETS])
def test_trainable_parameters_are_the_adapters_only(targets):
    cfg, model = _lora_model(targets)
    assert num_trainable_params(model) == expected_lora_params(cfg, targets, 4)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)
    # base state-dict keys are unchanged by the adapters
    base_keys = set(build_model(cfg, "cpu", seed=0).state_dict())
    assert base_keys <= set(model.state_dict())


def test_starts_equal_to_base_and_base_stays_bitwise_unchanged():
    cfg, model = _lora_model()
    base = build_model(cfg, "cpu", seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    torch.testing.assert_close(model(tokens), base(tokens), rtol=0, atol=0)  # B = 0 at the start
    before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        loss = model(tokens).logsumexp(-1).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for name, param in model.named_parameters():
        if param.requires_grad:
            continue
        assert torch.equal(param, before[name]), name
    assert any(m.lora_B.abs().sum() > 0 for m in lora_modules(model).values())  # the adapters did train


def test_merge_is_exact_within_fp32_rounding():
    cfg, model = _lora_model()
    _randomise_b(model)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    unmerged = model(tokens)
    merge_lora(model)
    torch.testing.assert_close(model(tokens), unmerged, rtol=1e-5, atol=1e-5)


def test_adapter_init_depends_on_seed_and_name_only():
    _, a = _lora_model(seed=3)
    _, b = _lora_model(seed=3)
    for (name, ma), mb in zip(lora_modules(a).items(), lora_modules(b).values()):
        assert torch.equal(ma.lora_A, mb.lora_A), name
    first, second = list(lora_modules(a).values())[:2]  # q and k of layer 0: different names, different draws
    assert not torch.equal(first.lora_A.flatten()[:16], second.lora_A.flatten()[:16])


def test_peft_loads_the_adapter_with_meshlm_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from meshlm.interop.hf import hf_name
    from meshlm.interop.hf_config import hf_config_from_model
    from meshlm.interop.peft import write_peft_adapter

    cfg, model = _lora_model(["q", "v", "down"])
    _randomise_b(model)
    model.eval()
    base_state = {hf_name(n, cfg.family): t for n, t in model.state_dict().items() if "lora_" not in n}
    config = hf_config_from_model(cfg, 1, [2], 0)
    hf_cfg = transformers.LlamaConfig(**{k: v for k, v in config.items() if k not in ("architectures",
                                                                                       "model_type")})
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict(base_state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    write_peft_adapter(model, tmp_path, ["q", "v", "down"], 4, 8.0, 0.0)
    adapted = peft.PeftModel.from_pretrained(hf, tmp_path).eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, 12))
    with torch.no_grad():
        ours = model(tokens)
        merge_lora(model)
        merged = model(tokens)
        theirs = adapted(input_ids=tokens).logits
    assert (ours - model(tokens)).abs().max() < 1e-4  # merged == adapter form
    torch.testing.assert_close(theirs, merged, rtol=0, atol=1e-4)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_dropout_under_activation_checkpointing_replays_the_forward_masks(mode):
    """With LoRA dropout, the checkpointed blocks' recompute must draw the masks their forward drew: the adapters'
    gradients equal those of the same step without checkpointing (same seed before the step)."""
    from meshlm.distributed.activation_checkpoint import apply_activation_checkpointing

    grads = []
    for ac in ("none", mode):
        cfg = flavor_config("debug")
        model = build_model(cfg, "cpu", seed=0)
        apply_lora(model, ["q", "v", "down"], 4, 8.0, dropout=0.3)
        reset_lora_parameters(model, 0)
        _randomise_b(model)
        apply_activation_checkpointing(model, ac)
        tokens = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
        torch.manual_seed(7)
        model(tokens).float().square().mean().backward()
        grads.append({n.replace("_checkpoint_wrapped_module.", ""): p.grad.clone()
                      for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("bias", [False, True])
def test_the_fused_lora_step_equals_the_plain_formula(bias):
    """The fused path (one autograd function: the update and the input-gradient terms added by the GEMMs) gives
    the plain formula's output and gradients; dropout, autocast and a trained base take the plain path."""
    from meshlm.models.lora import LoRALinear

    torch.manual_seed(0)
    layer = LoRALinear(48, 80, bias, 8, 16.0, 0.0)  # its adapters start as torch.empty: draw both
    layer.reset_lora(torch.Generator().manual_seed(0))
    torch.nn.init.normal_(layer.lora_B, std=0.1)
    layer.weight.requires_grad_(False)
    if bias:
        layer.bias.requires_grad_(False)
    x = torch.randn(2, 33, 48, requires_grad=True)
    grad = torch.randn(2, 33, 80)

    def run(fused: bool):
        layer._fused_ok = lambda _: fused  # instance attribute: this layer only
        x.grad = layer.lora_A.grad = layer.lora_B.grad = None
        out = layer(x)
        out.backward(grad)
        assert (type(out.grad_fn).__name__ == "_LoRAFunctionBackward") == fused
        return [out.detach().clone(), x.grad.clone(), layer.lora_A.grad.clone(), layer.lora_B.grad.clone()]

    for got, want in zip(run(True), run(False)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    del layer._fused_ok
    assert layer._fused_ok(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not layer._fused_ok(x)
    layer.weight.requires_grad_(True)
    assert not layer._fused_ok(x)
    dropped = LoRALinear(48, 80, False, 8, 16.0, 0.1).requires_grad_(False)
    assert not dropped._fused_ok(x)  # dropout
