#!/usr/bin/env python3
"""Post-training data made from the demo corpus (the King James Bible, `bible`).

Writes, into OUT_DIR:
  chats.jsonl   SFT: {"messages": [user "Quote Genesis C:V", assistant the verse]}
  prefs.jsonl   DPO: {"prompt": "Quote Genesis C:V", "chosen": the verse, "rejected": another verse}
for the verses of Genesis chapters 1..CHAPTERS. The rejected verse is drawn
from the same chapters with a fixed seed, so the data is the same on every run.
Usage: kjv_post_train.py OUT_DIR [CHAPTERS]
"""
import json
import random
import re
import subprocess
import sys


def verses(chapters):
    text = subprocess.run(["bible", "-f", f"Gen1:1-Gen{chapters}:99"], check=True, capture_output=True,
                          text=True).stdout
    out = []
    for line in text.splitlines():
        m = re.match(r"^Ge(\d+):(\d+) (.*)$", line)
        if m and int(m.group(1)) <= chapters:
            out.append((f"Genesis {m.group(1)}:{m.group(2)}", m.group(3).strip()))
    return out


def main():
    out_dir = sys.argv[1]
    chapters = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    vs = verses(chapters)
    if not vs:
        sys.exit("kjv_post_train.py: `bible` printed no verses of Genesis")
    rng = random.Random(1)
    with open(f"{out_dir}/chats.jsonl", "w") as chats, open(f"{out_dir}/prefs.jsonl", "w") as prefs:
        for i, (ref, text) in enumerate(vs):
            prompt = f"Quote {ref}"
            chats.write(json.dumps({"messages": [{"role": "user", "content": prompt},
                                                 {"role": "assistant", "content": text}]}) + "\n")
            j = rng.randrange(len(vs) - 1)
            wrong = vs[j if j < i else j + 1][1]
            prefs.write(json.dumps({"prompt": prompt, "chosen": text, "rejected": wrong}) + "\n")
    print(f"{len(vs)} verses of Genesis 1-{chapters} -> {out_dir}/chats.jsonl, {out_dir}/prefs.jsonl")


if __name__ == "__main__":
    main()
