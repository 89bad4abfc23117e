"""Run in a fresh process: a conversation of >= 20,000 tokens inside a fixed budget.

Prints one JSON object: tokens, turns, truncations, the plan and the peak RSS.
"""

import json
import sys

from runtime.llm.chat import ChatSession
from runtime.llm.model import LLM
from runtime.metrics import peak_rss_bytes
from runtime.units import parse_size

model, budget_text, target_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
kv_type = sys.argv[4] if len(sys.argv) > 4 else None
with LLM.load(model, memory=budget_text, kv_type=kv_type, threads=2) as llm:
    session = ChatSession(llm, "You are the shift log assistant of a packaging line. Answer in one short sentence.",
                          llm.params(temperature=0.0, max_tokens=40))
    total = turns = truncations = shifts = 0
    max_kv = 0
    while total < target_tokens:
        note = " ".join(f"Station {turns % 17} reading {turns * 13 + i} units ok." for i in range(14))
        result = session.send(f"Log entry {turns}: {note} Summarize.").finish()
        total += len(llm.tokenize(session.messages[-2]["content"])) + result.tokens_out
        turns += 1
        truncations += len(result.truncations)
        shifts += result.reuse_source == "kv+shift"
        max_kv = max(max_kv, len(llm.kv.tokens))
    print(json.dumps({"tokens": total, "turns": turns, "truncations": truncations, "gap_shifts": shifts, "max_kv_tokens": max_kv,
                      "n_ctx": llm.n_ctx, "kv_type": llm.plan.kv_type.value, "planned_bytes": llm.plan.total_bytes,
                      "budget_bytes": parse_size(budget_text), "peak_rss_bytes": peak_rss_bytes()}))
