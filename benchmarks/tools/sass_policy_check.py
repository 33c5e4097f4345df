"""Check a cuobjdump SASS dump for L2-hinted copies whose policy register is never written.

ptxas 13.0 can emit `LDGSTS ... desc[URn]` without any instruction that writes URn (the
copy then faults with an illegal instruction); kernels/mma_nvidia.h's hinted_copy avoids the
pattern, and this check keeps it that way.  Usage: python benchmarks/tools/sass_policy_check.py sass.txt
Prints one line; exits 1 when some function has such a copy.
"""
import re
import sys


def unwritten_policy_registers(sass):
    """(function name, register) for every desc[URn] of an LDGSTS that no other
    instruction of the same function mentions."""
    bad = []
    for func in re.split(r"\n\s*Function : ", sass)[1:]:
        name, body = func.split("\n", 1)
        lines = body.split("\n")
        used = set()
        for line in lines:
            if "LDGSTS" in line:
                used.update(re.findall(r"desc\[(UR\d+)\]", line))
        for reg in sorted(used):
            pattern = re.compile(r"\b%s\b" % reg)
            if not any(pattern.search(line) and "LDGSTS" not in line for line in lines):
                bad.append((name.strip(), reg))
    return bad


def main():
    sass = open(sys.argv[1]).read()
    hinted = len(re.findall(r"LDGSTS[^\n]*desc\[", sass))
    bad = unwritten_policy_registers(sass)
    print(f"sass: {hinted} L2-hinted copies, {len(bad)} functions with an unwritten policy register")
    for name, reg in bad[:5]:
        print(f"  {reg} in {name[:120]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
