"""lm-eval helpers for the gsm-synth tasks (scripts/lm-eval/*.yaml): the multiple-choice documents."""

NEAR_MISSES = (1, -1, 10)  # offsets of the three wrong choices from the answer


def _mc_doc(doc, index):
    lines = doc["answer"].split("\n")
    working, final = "\n".join(lines[:-1]), lines[-1].split("####")[-1].strip()
    answer = int(final.replace(",", ""))  # GSM8K writes 1,000
    wrong = []
    for offset in NEAR_MISSES:
        candidate = answer + offset
        if candidate < 0 or candidate == answer or candidate in wrong:
            candidate = answer + 10 + len(wrong) + 1
        wrong.append(candidate)
    gold = index % (len(wrong) + 1)  # the answer's place rotates
    choices = [str(w) for w in wrong]
    choices.insert(gold, str(answer))
    context = "Question: " + doc["question"] + "\nAnswer: " + (working + "\n" if working else "") + "####"
    return {"context": context, "choices": choices, "gold": gold}


def mc_docs(dataset):
    return dataset.map(_mc_doc, with_indices=True)
