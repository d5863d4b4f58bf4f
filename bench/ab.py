"""Two commits of nwhisper side by side: bench/transcribe.py on a snapshot of each, interleaved.

    python3 bench/ab.py BEFORE AFTER [--rounds 3] [--models tiny.en,base] [--clips 11,63]

Each round runs transcribe.py once on BEFORE and once on AFTER (the order alternates between
rounds), nwhisper float32 and int8 only, one recorded round each; then one line per model, clip
and system: the warm transcription's median over rounds for each commit, AFTER / BEFORE, the
spread of the per-round values, and whether the two commits' transcripts are the same text.
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run(rev, args, work):
    before = set(glob.glob(os.path.join(work, "raw-*.jsonl")))
    cmd = [sys.executable, os.path.join(HERE, "transcribe.py"), "--rev", rev, "--systems",
           "nwhisper,nwhisper-int8", "--rounds", "1", "--models", args.models, "--clips", args.clips,
           "--no-roofline", "--no-first-cold", "--work", work]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    (raw,) = set(glob.glob(os.path.join(work, "raw-*.jsonl"))) - before
    rows = [json.loads(line) for line in open(raw)]
    return {(r["model"], str(r["clip"]), r["system"]): r["result"] for r in rows
            if r.get("round") == 0 and "error" not in r.get("result", {"error": 1})}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--clips", default="11,63")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "nwhisper-bench"))
    args = p.parse_args()
    results = {args.before: [], args.after: []}
    for k in range(args.rounds):
        for rev in ((args.before, args.after) if k % 2 == 0 else (args.after, args.before)):
            results[rev].append(run(rev, args, args.work))
            print(f"round {k + 1}: {rev} done", flush=True)
    print(f"\nwarm transcription s, median of {args.rounds} rounds (each a median of warm repeats)")
    print(f"{'model, clip, system':34}{args.before:>12}{args.after:>12}  after/before  spread  same text")
    for key in sorted(results[args.before][0]):
        a = [statistics.median(r[key]["warm"]) for r in results[args.before] if key in r]
        b = [statistics.median(r[key]["warm"]) for r in results[args.after] if key in r]
        if not a or not b:
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        spread = max((max(x) - min(x)) / statistics.median(x) for x in (a, b))
        same = {r[key]["text"] for r in results[args.before] + results[args.after] if key in r}
        print(f"{', '.join(key):34}{ma:12.3f}{mb:12.3f}{mb / ma:14.3f}{spread:8.0%}  {'yes' if len(same) == 1 else 'NO'}")


if __name__ == "__main__":
    main()
