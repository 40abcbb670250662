#!/usr/bin/env python3
"""scripts/cpu-vs-llamacpp-summary.py: per-round values and medians of each engine, ratios of
medians, the load averages of the runs, and a log with no results refused."""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "cpu-vs-llamacpp-summary.py")

QSPEC = """model models/smollm2, 4-bit weights int4 g64 rtn (53.79 MiB), 2 threads, prompt 64, decode 64, median of 3
mode                    prefill         decode
w4a16                 {p16} t/s       {d16} t/s
w4a8                  {p8} t/s       {d8} t/s
"""
LLAMA = """| model                          |       size |     params | backend    | threads |            test |                  t/s |
| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |
| llama 256M Q4_1                |  92.10 MiB |   134.52 M | CPU        |       2 |            pp64 |      {pp} ± 1.00 |
| llama 256M Q4_1                |  92.10 MiB |   134.52 M | CPU        |       2 |            tg64 |       {tg} ± 0.50 |
"""


def run(text):
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(text)
    try:
        return subprocess.run([sys.executable, SCRIPT, f.name], capture_output=True, text=True)
    finally:
        os.unlink(f.name)


def uptime(load):
    return f"uptime:  04:36:43 up 10:52,  0 user,  load average: {load}, 4.39, 4.03\n"


def main():
    log = "# 2026-11-29T04:36:43Z AMD EPYC (2 cores)\n"
    rounds = [(200.0, 150.0, 300.0, 180.0, 210.0, 120.0, 1.5), (220.0, 140.0, 320.0, 200.0, 190.0, 100.0, 2.5),
              (210.0, 160.0, 310.0, 190.0, 200.0, 110.0, 0.5)]
    for i, (p16, d16, p8, d8, pp, tg, load) in enumerate(rounds, 1):
        log += f"== round {i} qspec\n" + uptime(load) + QSPEC.format(p16=p16, d16=d16, p8=p8, d8=d8)
        log += f"== round {i} llama.cpp\n" + uptime(load + 1) + LLAMA.format(pp=pp, tg=tg)
        log += f"== round {i} llama.cpp --poll 0\n" + LLAMA.format(pp=2 * pp, tg=2 * tg)
    result = run(log)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    engines = summary["engines"]
    assert engines["qspec w4a16"]["decode"]["per_round"] == [150.0, 140.0, 160.0], engines
    assert engines["qspec w4a16"]["decode"]["median"] == 150.0
    assert engines["qspec w4a8"]["prefill"]["median"] == 310.0
    assert engines["llama.cpp"]["decode"]["median"] == 110.0
    assert engines["llama.cpp"]["prefill"]["per_round"] == [210.0, 190.0, 200.0]
    ratios = summary["ratios_of_medians"]
    assert ratios["qspec w4a16 decode / llama.cpp decode"] == round(150.0 / 110.0, 3), ratios
    assert ratios["qspec w4a8 decode / llama.cpp decode"] == round(190.0 / 110.0, 3), ratios
    assert ratios["qspec w4a8 prefill / llama.cpp prefill"] == round(310.0 / 200.0, 3), ratios
    assert engines["llama.cpp --poll 0"]["decode"]["median"] == 220.0, engines
    assert ratios["qspec w4a16 decode / llama.cpp --poll 0 decode"] == round(150.0 / 220.0, 3), ratios
    assert len(ratios) == 8, ratios
    paired = summary["ratios_within_rounds"]["qspec w4a16 decode / llama.cpp decode"]
    assert paired["per_round"] == [round(150 / 120, 3), round(140 / 100, 3), round(160 / 110, 3)], paired
    assert paired["median"] == round(140 / 100, 3), paired
    loads = summary["load_average_1min"]
    assert loads["per_run"] == [1.5, 2.5, 2.5, 3.5, 0.5, 1.5], loads
    assert (loads["min"], loads["median"], loads["max"]) == (0.5, 2.0, 3.5), loads
    assert summary["header"] == ["2026-11-29T04:36:43Z AMD EPYC (2 cores)"]
    empty = run("# nothing ran\n== round 1 qspec\n")
    assert empty.returncode != 0 and "no qspec or llama-bench results" in empty.stderr, empty
    print("ok")


if __name__ == "__main__":
    main()
