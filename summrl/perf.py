"""Benchmarks that print JSON. `python -m summrl.perf step [--steps N]`.

step: the embedded GRPO step of `experiment=local` (2 sample documents x 4 rollouts, 128 new tokens),
timed with the loop's own ``train_step``; generation throughput of 8 concurrent vs the same 8
sequential requests through the loopback endpoint; and the start-up time of
``python -m summrl.train --cfg job``. Medians over repeats, since these machines are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEP_OVERRIDES = [
    "experiment=local",
    "trainer.groups_per_step=2",
    "trainer.rollouts_per_group=4",
    "trainer.max_summary_tokens=128",
]


def compose_local(run_dir: str, overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from summrl.config import validate

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, f"run.dir={run_dir}", "run.name=perf"], return_hydra_config=True)
    return validate(cfg, dict(cfg.hydra.runtime.choices))


def startup_seconds(repeats: int = 3) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "summrl.train", "--cfg", "job"], cwd=ROOT, check=True,
                       capture_output=True)
        times.append(time.perf_counter() - start)
    return times


async def throughput(session, documents, max_tokens: int, repeats: int) -> tuple[list[float], list[float]]:
    """Completion tokens per second: 2 documents x 4 requests sent at once, then the same 8 one by one."""
    from summrl.rollout import SYSTEM_PROMPT, summary_prompt

    client = session.model.openai_client()
    requests = [
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": summary_prompt(d, 350)}]
        for d in documents[:2] for _ in range(4)
    ]

    async def one(messages) -> int:
        completion = await client.chat.completions.create(
            model=session.model.get_inference_name(), messages=messages, max_tokens=max_tokens, temperature=1.0)
        return completion.usage.completion_tokens

    batched, sequential = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(m) for m in requests)))
        batched.append(tokens / (time.perf_counter() - start))
        start, tokens = time.perf_counter(), 0
        for messages in requests:
            tokens += await one(messages)
        sequential.append(tokens / (time.perf_counter() - start))
    return batched, sequential


async def bench_step(steps: int, repeats: int) -> dict:
    from summrl.data import load_splits
    from summrl.loop import open_session, seed_everything, train_step

    with tempfile.TemporaryDirectory(prefix="summrl-perf-") as run_dir:
        config = compose_local(run_dir, STEP_OVERRIDES)
        seed_everything(config.trainer.seed)
        _, train_docs = load_splits(**{k: getattr(config.dataset, k) for k in
                                       ("files", "hf_path", "hf_split", "seed", "train_size", "val_size")})
        load_start = time.perf_counter()
        session = await open_session(config)
        load_s = time.perf_counter() - load_start
        try:
            batched, sequential = await throughput(session, train_docs, config.trainer.max_summary_tokens, repeats)
            timings = []
            for i in range(steps):
                documents = train_docs[2 * i : 2 * i + 2]
                start = time.perf_counter()
                scored, _ = await train_step(session, documents)
                timings.append({"step_s": time.perf_counter() - start, **scored.timings})
        finally:
            await session.backend.close()
    median = lambda key: round(statistics.median(t[key] for t in timings), 2)  # noqa: E731
    return {
        "step_median_s": median("step_s"),
        "generate_s": median("generate_s"),
        "score_s": median("score_s"),
        "train_s": median("train_s"),
        "steps": steps,
        "step_times_s": [round(t["step_s"], 2) for t in timings],
        "batched_tok_s": round(statistics.median(batched), 1),
        "sequential_tok_s": round(statistics.median(sequential), 1),
        "batched_speedup": round(statistics.median(batched) / statistics.median(sequential), 2),
        "model_load_s": round(load_s, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m summrl.perf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="benchmark", required=True)
    step = sub.add_parser("step", help="embedded GRPO step time, batched generation, start-up time")
    step.add_argument("--steps", type=int, default=3, help="GRPO steps to time (median reported)")
    step.add_argument("--repeats", type=int, default=2, help="throughput measurements (median reported)")
    args = parser.parse_args(argv)

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    startup = startup_seconds()
    result = asyncio.run(bench_step(args.steps, args.repeats))
    result["startup_s"] = round(statistics.median(startup), 2)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
