"""Peak memory of ``meshlm convert from-hf`` against the size of the model it converts.

Writes a random HF Llama checkpoint of about 1 GB (several safetensors shards, written tensor by tensor so this
script never holds the model either), runs ``meshlm convert from-hf`` on it in a subprocess, and reports that
subprocess's peak resident set (VmHWM; see _HWM_WRAPPER for why not ru_maxrss alone) beside the model size and
beside the peak of the same command on a tiny model (every import and fixed cost, no weights to speak of): the
baseline no conversion can avoid.

    python scripts/bench_convert_memory.py                      # ~1.1 GB fp32 model, 4 shards
    python scripts/bench_convert_memory.py --dtype bf16 --json
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from meshlm.interop.hf import expected_shapes, hf_name
from meshlm.interop.hf_config import hf_config_from_model
from meshlm.interop.hf_tokenizer import hf_tokenizer_config
from meshlm.models import ModelConfig

_SAFETENSORS_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16"}


def model_config(args: argparse.Namespace) -> ModelConfig:
    """A Llama shape of ~276M parameters (1.1 GB in fp32) whose largest tensor (the embedding) is 1/11 of it."""
    return ModelConfig(dim=args.dim, n_layers=args.layers, n_heads=12, n_kv_heads=4, head_dim=128,
                       ffn_hidden_dim=args.ffn, vocab_size=args.vocab, max_seq_len=4096)


def write_shard(path: Path, names: list[str], shapes: dict[str, tuple[int, ...]], dtype: torch.dtype,
                seed: int) -> None:
    """A safetensors file written by hand: 8-byte header length, JSON header, then each tensor's bytes, generated
    one tensor at a time (safetensors' save_file would need the whole shard in memory)."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    itemsize = torch.tensor([], dtype=dtype).element_size()
    for name in names:
        nbytes = itemsize * int(torch.Size(shapes[name]).numel())
        header[name] = {"dtype": _SAFETENSORS_DTYPE[dtype], "shape": list(shapes[name]),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the format aligns the data to 8 bytes
    gen = torch.Generator().manual_seed(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name in names:
            tensor = (torch.randn(shapes[name], generator=gen) * 0.02).to(dtype)
            f.write(tensor.view(torch.uint8).numpy().tobytes())
            del tensor


def write_hf_model(folder: Path, cfg: ModelConfig, dtype: torch.dtype, num_shards: int) -> int:
    """config.json, tokenizer files and ``num_shards`` weight shards with an index; returns the weight bytes."""
    from meshlm.data import embedded_documents
    from meshlm.tokenizer import MeshTokenizer

    folder.mkdir(parents=True)
    tokenizer = MeshTokenizer.train(embedded_documents()[:20], vocab_size=512)
    tokenizer.save(folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps(hf_tokenizer_config("<|bos|>", "<|eos|>", "<|pad|>",
                                                                                  cfg.max_seq_len)))
    config = hf_config_from_model(cfg, tokenizer.bos_id, [tokenizer.eos_id], tokenizer.pad_id,
                                  dtype=str(dtype).removeprefix("torch."))
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    shapes = {hf_name(n, cfg.family): s for n, s in expected_shapes(cfg).items()}
    names = list(shapes)
    per_shard = -(-len(names) // num_shards)
    weight_map, itemsize = {}, torch.tensor([], dtype=dtype).element_size()
    for i in range(num_shards):
        file = f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors"
        chunk = names[i * per_shard:(i + 1) * per_shard]
        write_shard(folder / file, chunk, shapes, dtype, seed=i)
        weight_map.update({n: file for n in chunk})
    total = sum(itemsize * int(torch.Size(s).numel()) for s in shapes.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return total


# Run a module as __main__ and, at exit, write the process's VmHWM (peak resident set of its own address space) to
# stderr. ru_maxrss alone misleads here: Linux carries the parent's high-water mark across fork + exec into the
# child's ru_maxrss, so a child of this script (which has imported torch and generated tensors) would report at least
# this script's own peak. VmHWM belongs to the address space exec created.
_HWM_WRAPPER = """
import atexit, runpy, sys
def report():
    hwm = [line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')]
    sys.stderr.write(f'__vmhwm_kib__ {hwm[0]}\\n')
atexit.register(report)
module, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_module(module, run_name='__main__', alter_sys=True)
"""


def peak_rss(module: str, *args: str) -> tuple[int, int, float]:
    """(VmHWM bytes, ru_maxrss bytes, seconds) of ``python -m module args`` in a subprocess."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _HWM_WRAPPER, module, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"python -m {module} {' '.join(args)} failed:\n{err}")
    hwm = int(err.split("__vmhwm_kib__ ")[1].split()[0]) * 1024
    return hwm, usage.ru_maxrss * 1024, time.perf_counter() - start  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="dtype of the HF weights")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--dim", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--ffn", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--workdir", help="where to write the models (default: a temp folder, deleted)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    cfg = model_config(args)
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        hf_dir, out = Path(work) / "hf", Path(work) / "meshlm"
        weight_bytes = write_hf_model(hf_dir, cfg, dtype, args.shards)
        largest = max(int(torch.Size(s).numel()) for s in expected_shapes(cfg).values()) * 4
        tiny = argparse.Namespace(**{**vars(args), "dim": 128, "layers": 1, "ffn": 256, "vocab": 512})
        write_hf_model(Path(work) / "tiny", model_config(tiny), dtype, 1)
        # The same command on a 0.3M-parameter model: every import and fixed cost, no weights to speak of.
        baseline, _, _ = peak_rss("meshlm", "convert", "from-hf", str(Path(work) / "tiny"), str(Path(work) / "t"))
        peak, maxrss, seconds = peak_rss("meshlm", "convert", "from-hf", str(hf_dir), str(out))
    result = {"num_params": cfg.num_params(), "hf_dtype": args.dtype, "hf_weight_bytes": weight_bytes,
              "fp32_model_bytes": cfg.num_params() * 4, "largest_tensor_fp32_bytes": largest,
              "peak_rss_bytes": peak, "baseline_rss_bytes": baseline, "ru_maxrss_bytes": maxrss,
              "seconds": round(seconds, 1),
              "peak_over_model": round(peak / weight_bytes, 3),
              "peak_minus_baseline_over_model": round((peak - baseline) / weight_bytes, 3)}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    gib = 2**30
    print(f"model: {cfg.num_params():,} parameters, {weight_bytes / gib:.2f} GiB of {args.dtype} weights in "
          f"{args.shards} shards (largest tensor {largest / gib:.2f} GiB in fp32)")
    print("baseline: the same command on a tiny model")
    print(f"convert from-hf peak RSS {peak / gib:.2f} GiB = {result['peak_over_model']:.2f} x the model; "
          f"baseline {baseline / gib:.2f} GiB; above it {(peak - baseline) / gib:.2f} GiB = "
          f"{result['peak_minus_baseline_over_model']:.2f} x the model; {seconds:.1f} s (ru_maxrss "
          f"{maxrss / gib:.2f} GiB, inflated by this script's own peak)")


if __name__ == "__main__":
    main()
