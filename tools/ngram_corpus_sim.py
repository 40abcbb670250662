#!/usr/bin/env python3
"""What prompt lookup in other requests' text (NgramCorpus, runtime/ngram_draft.h) adds, on a
replay-texts record (`qspec eval qspec --save-reference`): the texts are served one after the
other at batch 1; each cycle drafts up to GAMMA tokens by lookup, in the sequence's own tokens
(longest suffix of 3..1 tokens with an earlier occurrence), else (--corpus) in the finished texts
before it (prompt + output, suffixes of up to 4 tokens), and keeps the drafts the text confirms.
A cycle with drafts costs --verify-cost plain steps (the H200's verify of 5 tokens at batch 1 is
~1.12 of a step), one without costs a step. Prints tokens per step cost (the speed-up over plain
decoding at batch 1, no planner) and the share of drafts kept.

  tools/ngram_corpus_sim.py bench/results/replay-texts-smollm2-gsm8k-chat-64x128.json
"""
import argparse
import json


def own_lookup(tokens, gamma, nmin=1, nmax=3):
    length = len(tokens)
    for n in range(min(nmax, length - 1), nmin - 1, -1):
        suffix = tokens[length - n:]
        for start in range(length - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + gamma]
    return []


class Corpus:
    def __init__(self, max_n):
        self.max_n, self.latest, self.docs = max_n, {}, []

    def add(self, tokens):
        doc = len(self.docs)
        self.docs.append(tokens)
        for end in range(1, len(tokens)):  # n-grams ending at end - 1, with a token after them
            for n in range(1, min(self.max_n, end) + 1):
                self.latest[tuple(tokens[end - n:end])] = (doc, end)

    def lookup(self, tokens, gamma, nmin):
        for n in range(min(self.max_n, len(tokens)), nmin - 1, -1):
            hit = self.latest.get(tuple(tokens[-n:]))
            if hit:
                doc, end = hit
                return self.docs[doc][end:end + gamma]
        return []


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("texts")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--verify-cost", type=float, default=1.118)
    parser.add_argument("--corpus-min", type=int, default=1, help="shortest corpus match (default 1)")
    args = parser.parse_args()
    record = json.load(open(args.texts))
    for use_corpus in (False, True):
        corpus = Corpus(4)
        cost = produced = drafted = kept = 0.0
        for prompt, output in zip(record["prompts"], record["outputs"]):
            tokens, pos = list(prompt), 0
            while pos < len(output):
                drafts = own_lookup(tokens, args.gamma)
                if not drafts and use_corpus:
                    drafts = corpus.lookup(tokens, args.gamma, args.corpus_min)
                if drafts:
                    k = 0
                    while k < len(drafts) and pos + k < len(output) and drafts[k] == output[pos + k]:
                        k += 1
                    advance = min(k + 1, len(output) - pos)
                    cost += args.verify_cost
                    drafted += len(drafts)
                    kept += k
                else:
                    advance = 1
                    cost += 1.0
                tokens += output[pos:pos + advance]
                pos += advance
                produced += advance
            corpus.add(list(prompt) + list(output))
        print(f"{'own + corpus' if use_corpus else 'own tokens  '}: {produced / cost:.3f}x, drafts kept {kept / max(drafted, 1):.1%}")


if __name__ == "__main__":
    main()
