"""Count a suite's outcomes from pytest's JUnit XML: pass, skipped, refused (FA_ERR_UNSUPPORTED or another
flashattn 'not offered' message, by argument), wrong (an assertion failed) and errors (anything else).

    python count.py results.xml"""
import collections
import re
import sys
import xml.etree.ElementTree as ET


def main(path):
    counts, refused = collections.Counter(), collections.Counter()
    for case in ET.parse(path).getroot().iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if case.find("skipped") is not None:
            counts["skipped"] += 1
        elif bad is None:
            counts["pass"] += 1
        else:
            text = (bad.get("message") or "") + (bad.text or "")
            m = re.search(r"FA_ERR_UNSUPPORTED: (?:\w+: )?(\w+)", text)
            if m:
                counts["refused"] += 1
                refused[m.group(1)] += 1
            elif "AssertionError" in text or bad.tag == "failure" and "assert" in text:
                counts["wrong"] += 1
            else:
                counts["errors"] += 1
    print(", ".join(f"{k} {counts[k]}" for k in ("pass", "wrong", "errors", "refused", "skipped")))
    for name, n in refused.most_common():
        print(f"  refused {name}: {n}")


if __name__ == "__main__":
    main(sys.argv[1])
