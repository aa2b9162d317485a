"""`brisk bench distributed`: one process vs N loopback ranks on the same prompt.

Each side is a real `brisk run --json` (greedy, plain decoding), so TTFT and decode tok/s
are what a user gets. The ranks also time the collectives one decode step makes, at their
real sizes (engine/distributed/lockstep.py: probe_collectives). On a machine with few cores
the ranks share the cores, so loopback cannot be faster; what it shows is the overhead
per token, and from the measured bytes per token, what a real link would cost (the paper
case: `link_estimates`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from brisk.engine.api.errors import BriskError
from brisk.engine.distributed.hostfile import MAX_RANKS

# Effective numbers for one small message and for bulk transfer over TCP on each link.
# Latency is per collective step (a 2-rank ring all_sum is one exchange each way); these are
# assumptions, printed with the estimate, not measurements from this machine.
LINKS = {
    "thunderbolt-5": {"gbit_s": 80.0, "efficiency": 0.6, "latency_us": 30.0},
    "thunderbolt-4": {"gbit_s": 40.0, "efficiency": 0.6, "latency_us": 40.0},
    "10-gbe": {"gbit_s": 10.0, "efficiency": 0.9, "latency_us": 60.0},
}
TEXT = (
    "Brisk splits a model across machines with MLX's ring collectives. Each rank holds half of every "
    "layer's heads and half of its MLP, and the partial results are summed after attention and after the "
    "MLP. The embedding and the output head are split by vocabulary rows. "
)


def add_distributed_bench(bench) -> None:
    p = bench.add_parser("distributed", help="1 process vs N loopback ranks: TTFT, decode tok/s, collective time")
    p.add_argument("--model", required=True)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=128, help="about this many prompt tokens")
    p.add_argument("--gen-tokens", type=int, default=32)
    p.add_argument("--runs", type=int, default=1, help="runs per side (medians)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_distributed_bench)


def _brisk_run(model: str, prompt_file: str, gen: int, ranks: int) -> dict:
    from brisk.engine.distributed.lockstep import PROBE_ENV
    from brisk.engine.runtime.python_argv import module_argv

    argv = ["run", "--model", model, "--prompt-file", prompt_file, "--temp", "0", "--json"]
    argv += ["--max-tokens", str(gen), "--spec-decode", "off", "--no-lookup"]
    if ranks > 1:
        argv += ["--ranks", str(ranks)]
    env = dict(os.environ, **{PROBE_ENV: "1"})
    out = subprocess.run(module_argv("brisk.engine.host.cli", *argv), capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise BriskError(f"brisk run with {ranks} rank(s) failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)


def link_estimates(collectives: dict, single_s_per_token: float) -> dict:
    """Per-token communication on each link, and the decode time two machines would take:
    half the single machine's compute (each holds half the weights, and decoding reads them
    all once per token) plus the communication."""
    out = {}
    for name, link in LINKS.items():
        bandwidth = link["gbit_s"] * 1e9 / 8 * link["efficiency"]
        comm = (
            collectives["collectives_per_token"] * link["latency_us"] * 1e-6
            + collectives["collective_bytes_sent_per_token"] / bandwidth
        )
        two = single_s_per_token / 2 + comm
        out[name] = {
            **link,
            "comm_ms_per_token": comm * 1e3,
            "two_machines_ms_per_token": two * 1e3,
            "speedup_vs_one": single_s_per_token / two,
        }
    return out


def run_distributed_bench(args) -> int:
    if not 2 <= args.ranks <= MAX_RANKS:  # brisk run's rule
        raise BriskError(
            f"--ranks must be between 2 and {MAX_RANKS} (got {args.ranks}): the benchmark compares one process "
            "with that many ranks"
        )
    with tempfile.TemporaryDirectory(prefix="brisk-bench-") as tmp:
        prompt = Path(tmp) / "prompt.txt"
        prompt.write_text((TEXT * (args.prompt_tokens * 4 // len(TEXT) + 1))[: args.prompt_tokens * 4])
        sides: dict[int, list[dict]] = {1: [], args.ranks: []}
        for _ in range(args.runs):  # interleaved: the machine's load drifts
            for ranks in sides:
                sides[ranks].append(_brisk_run(args.model, str(prompt), args.gen_tokens, ranks))
    one, many = sides[1], sides[args.ranks]
    if one[0]["token_ids"] != many[0]["token_ids"]:
        raise BriskError("The ranks gave another greedy answer than one process: their timings do not compare")

    def median(runs: list[dict], key: str) -> float:
        return statistics.median(r["metrics"][key] for r in runs)

    collectives = many[-1]["metrics"].get("collectives", {})
    single_s = 1 / median(one, "decode_tps")
    result = {
        "model": args.model,
        "prompt_tokens": one[0]["metrics"]["prompt_tokens"],
        "generated_tokens": len(one[0]["token_ids"]),
        "identical_output": True,
        "one": {"ttft_s": median(one, "ttft_s"), "decode_tps": median(one, "decode_tps")},
        "ranks": {
            "n": args.ranks,
            "ttft_s": median(many, "ttft_s"),
            "decode_tps": median(many, "decode_tps"),
            "per_rank": many[-1]["metrics"]["ranks"],
            "collectives": collectives,
        },
        "overhead_ms_per_token": (1 / median(many, "decode_tps") - single_s) * 1e3,
        "links": link_estimates(collectives, single_s) if collectives else {},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    _print(result)
    return 0


def _print(r: dict) -> None:
    one, many, c = r["one"], r["ranks"], r["ranks"]["collectives"]
    print(f"{r['model']}: {r['prompt_tokens']} prompt tokens, {r['generated_tokens']} generated, same text on both")
    print(f"{'':>10} {'TTFT s':>8} {'decode tok/s':>13}")
    print(f"{'1 process':>10} {one['ttft_s']:>8.2f} {one['decode_tps']:>13.2f}")
    print(f"{str(many['n']) + ' ranks':>10} {many['ttft_s']:>8.2f} {many['decode_tps']:>13.2f}")
    for rank in many["per_rank"]:
        print(
            f"  rank {rank['rank']} ({rank['host']}): weights {rank['resident_weight_bytes'] / 2**20:.1f} MiB "
            f"({rank['weight_share']:.3f} of the model), KV {rank['kv_bytes'] / 2**10:.0f} KiB"
        )
    print(f"overhead {r['overhead_ms_per_token']:.1f} ms/token vs one process")
    if c:
        print(
            f"collectives per token: {c['collectives_per_token']} ({c['collective_bytes_sent_per_token'] / 1024:.0f} "
            f"KiB sent per rank), on loopback {c['collective_s_per_token'] * 1e3:.2f} ms median "
            f"(all_sum {c['all_sum_s'] * 1e6:.0f} µs, all_gather {c['all_gather_s'] * 1e6:.0f} µs), "
            f"{c['collective_fastest_s_per_token'] * 1e3:.2f} ms at the fastest "
            f"(all_sum {c['all_sum_fastest_s'] * 1e6:.0f} µs, all_gather {c['all_gather_fastest_s'] * 1e6:.0f} µs)"
        )
    for name, link in r["links"].items():
        print(
            f"  on {name} (assumed {link['gbit_s']:.0f} Gbit/s x {link['efficiency']}, {link['latency_us']:.0f} µs "
            f"per collective): {link['comm_ms_per_token']:.2f} ms/token of communication, two machines "
            f"{link['two_machines_ms_per_token']:.1f} ms/token ({link['speedup_vs_one']:.2f}x one)"
        )
