"""PERFORMANCE.md v41: scripts/experiments/qk_gluon.py (check, then timing) with attnlab.triton.qk_softmax_ahead's
module settings changed first, so that variants of the pass-1-ahead kernel (Tiles.pass1_ahead, label `j`) that are not
tile fields can be checked and timed. GPU (sm90) only:

    python scripts/experiments/qk_ahead.py IN_FLIGHT=0 PASS1_REGS=104 P1_N=64 -- <qk_gluon.py's arguments>

Each NAME=value before `--` sets that module constant (ints; IN_FLIGHT 0/1); CONSUMER_REGS follows PASS1_REGS as the
module computes it unless given too. Prints the settings first, so each log says which variant it holds.
"""
import sys

from attnlab.triton import qk_softmax_ahead as qa
import qk_gluon  # this script's directory is on sys.path when it runs


def main():
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    settings = dict(a.split("=", 1) for a in argv[:split])
    for name, value in settings.items():
        if not hasattr(qa, name):
            raise SystemExit(f"qk_softmax_ahead has no setting {name!r}")
        setattr(qa, name, bool(int(value)) if name == "IN_FLIGHT" else int(value))
    if "CONSUMER_REGS" not in settings:
        qa.CONSUMER_REGS = (5 * qa.MAXNREG - 24 - 2 * qa.PASS1_REGS) // 2 // 8 * 8
    print(f"variant IN_FLIGHT={int(qa.IN_FLIGHT)} PASS1_REGS={qa.PASS1_REGS} CONSUMER_REGS={qa.CONSUMER_REGS} "
          f"P1_N={qa.P1_N} P1_STAGES={qa.P1_STAGES}", flush=True)
    sys.argv = [sys.argv[0]] + argv[split + 1:]
    qk_gluon.main()


if __name__ == "__main__":
    main()
