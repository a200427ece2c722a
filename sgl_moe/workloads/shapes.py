"""The six workload shapes of seed 000 Table 2, one function each.

Each shape function makes one *group*: the requests that share a document or passage (QuALITY, BoolQ),
or a single request. ``mix`` interleaves groups and numbers the requests.

Lengths. Every length below is in tokens at scale 1 (Table 2) and is divided by ``length_scale``, with
floors that keep each shape's structure: a shared part of a High-share workload never shrinks below two
KV pages (32 tokens), bodies below a few tokens, candidates below one. Literal template pieces
(``"\\nQuestion:"``...) are not scaled; their tokens come out of the body they follow, so a prompt stays
within Table 2's range / ``length_scale`` (to a rounding token) wherever no floor binds. Prompts are
clipped to ``max_context`` by shortening the body (or the shared document, so the group still shares it).
Distributions: log-uniform for the sampled lengths (prompts of real datasets skew short), except
QuALITY's documents (uniform: its mean, 8.75K, is above the range's midpoint). Resulting means at scale 1
versus Table 2's (total tokens / requests): moral 144 vs 137, mmlu 196 vs 242, boolq 363 vs 225, imdb
895 vs 458, quality 8.1K vs 8.75K, arxiv 40K vs 16.8K (Table 2's totals imply a shorter tail than
log-uniform; at the default scale arxiv is mostly clipped to ``max_context`` anyway).

Shapes (prefix share in brackets):

* **moral** [High]: one of 4 long shared instructions (76-88 tokens, floor 32; 57% of the prompt on average) +
  a unique story (the rest of a 100-200 total); *choice* between 2 candidate actions (8-24 each).
* **mmlu** [Low]: a per-subject header (57 subjects, 16-24 tokens) + a question (50-500 in all);
  *choice* among 4 answers (2-16 each).
* **boolq** [Low]: a passage + ``"\\nQuestion:"`` + a question (8-20) + ``"\\nAnswer:"`` (200-600 in all);
  a passage has 1, 2 or 3 questions with probabilities .6/.3/.1 (1.5 on average, as real BoolQ);
  *classify* on ``[" yes", " no"]``.
* **imdb** [Low]: one short shared instruction (24) + a unique review + ``"\\nSentiment:"``
  (300-2K in all); *classify* on ``[" positive", " negative"]``.
* **quality** [High]: a long document (uniform, 4K-12K with its question) shared by 5-10 questions
  (``"\\nQuestion:"`` + 12-48 tokens); *choice* among 4 answers (6-40 each).
* **arxiv** [Medium]: a long unique document (6K-128K); *multi* over 3-6 of 11 category names, so the
  request's k sibling prefills share the document as prefix.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from sgl_moe.workloads.config import PAGE, WorkloadConfig
from sgl_moe.workloads.lengths import Lengths
from sgl_moe.workloads.request import ANSWER, WorkloadRequest
from sgl_moe.workloads.segments import Segment, literal, new_segment, stable_hash

HIGH_SHARE_FLOOR = 2 * PAGE
"""A High-share workload's shared part is never shorter than two KV pages, whatever the scale."""

MORAL_INSTRUCTIONS = (76, 80, 84, 88)
"""Scale-1 lengths of MoralStories' shared instruction variants."""
MMLU_SUBJECTS = 57
MMLU_HEADER = (16, 24)
"""Scale-1 length range of an MMLU subject header (fixed per subject)."""
IMDB_INSTRUCTION = 24
QUALITY_QUESTIONS = (5, 10)
"""Questions per QuALITY document (uniform)."""
ARXIV_CATEGORIES = 11
"""The ArXiv Classification dataset's classes."""
ARXIV_LABELS = (3, 6)
"""Categories offered per paper (the siblings of one multi task)."""
BOOLQ_QUESTIONS = (0.6, 0.9)
"""Cumulative probabilities of 1 and 2 questions per passage (else 3): 1.5 on average."""

ANSWER_KEYS = tuple(f"/answer#{j}" for j in range(4))
"""Key suffixes of four sibling answers (concatenation is cheaper than formatting, per request)."""

QUESTION = "\nQuestion:"
SENTIMENT = "\nSentiment:"


class ShapeContext:
    """What the shape functions share in one run: scaled length distributions and reusable segments."""

    def __init__(self, cfg: WorkloadConfig) -> None:
        self.cfg = cfg
        p = self.prefix = f"s{cfg.seed}/"  # starts every generated key, so two seeds never share text
        s, top = cfg.length_scale, cfg.max_context
        self.question, self.answer, self.sentiment = literal(QUESTION), literal(ANSWER), literal(SENTIMENT)

        self.moral_instructions = tuple(Segment(f"{p}moral/instruction/{v}", self.scaled(n, HIGH_SHARE_FLOOR))
                                        for v, n in enumerate(MORAL_INSTRUCTIONS))
        self.moral_story = tuple(Lengths.of(100, 200, log=True, scale=s, shift=n, floor=4, cap=top - i.tokens)
                                 for n, i in zip(MORAL_INSTRUCTIONS, self.moral_instructions))
        self.moral_action = Lengths.of(8, 24, log=True, scale=s, floor=2)

        headers = []
        for i in range(MMLU_SUBJECTS):
            key = f"{p}mmlu/subject/{i}"
            h1 = MMLU_HEADER[0] + stable_hash(key) % (MMLU_HEADER[1] - MMLU_HEADER[0] + 1)
            header = Segment(key, self.scaled(h1, 2))
            # the question gets the rest of the 50-500 total
            headers.append((header, Lengths.of(50, 500, log=True, scale=s, shift=h1, floor=3, cap=top - header.tokens)))
        self.mmlu_subjects = tuple(headers)
        self.mmlu_answer = Lengths.of(2, 16, log=True, scale=s, floor=1)

        self.boolq_question = Lengths.of(8, 20, log=True, scale=s, floor=2)
        fixed = self.question.tokens + self.answer.tokens
        self.boolq_passage = Lengths.of(200 - 8, 600 - 20, log=True, scale=s, minus=fixed, floor=8,
                                        cap=top - fixed - self.boolq_question.max)

        self.imdb_instruction = Segment(f"{p}imdb/instruction", self.scaled(IMDB_INSTRUCTION, 2))
        self.imdb_review = Lengths.of(300, 2000, log=True, scale=s, shift=IMDB_INSTRUCTION,
                                      minus=self.sentiment.tokens, floor=8,
                                      cap=top - self.imdb_instruction.tokens - self.sentiment.tokens)

        self.quality_question = Lengths.of(12, 48, log=True, scale=s, floor=2)
        self.quality_answer = Lengths.of(6, 40, log=True, scale=s, floor=1)
        self.quality_document = Lengths.of(4000 - 12, 12000 - 48, log=False, scale=s, minus=self.question.tokens,
                                           floor=HIGH_SHARE_FLOOR,
                                           cap=top - self.question.tokens - self.quality_question.max)

        self.arxiv_document = Lengths.of(6000, 128000, log=True, scale=s, floor=HIGH_SHARE_FLOOR, cap=top)
        self.arxiv_categories = tuple(Segment(f"{p}arxiv/category#{c}", self.scaled(2 + stable_hash(f"{p}{c}") % 5, 1))
                                      for c in range(ARXIV_CATEGORIES))

    def scaled(self, tokens1: float, floor: int) -> int:
        """A scale-1 length at this run's scale, never below ``floor``."""
        return max(floor, round(tokens1 / self.cfg.length_scale))

    @staticmethod
    def group(shared: Segment, own: str) -> str:
        """The shared segment's key if it is at least a page long (a prefix group), else ``own``."""
        return shared.key if shared.tokens >= PAGE else own


Shape = Callable[[ShapeContext, random.Random, int], list[WorkloadRequest]]
"""``shape(ctx, rng, g)``: group number ``g`` of a workload; request ids are left for ``mix`` to assign."""


def moral(ctx: ShapeContext, rng: random.Random, g: int) -> list[WorkloadRequest]:
    draw = rng.random
    v = int(draw() * len(MORAL_INSTRUCTIONS))
    instruction = ctx.moral_instructions[v]
    key = f"{ctx.prefix}moral/{g}"
    story = new_segment(key, ctx.moral_story[v].sample(draw))
    action = ctx.moral_action.sample
    actions = [new_segment(key + "/action#0", action(draw)), new_segment(key + "/action#1", action(draw))]
    return [WorkloadRequest("", "moral", "choice", [instruction, story], [], actions, ctx.group(instruction, key))]


def mmlu(ctx: ShapeContext, rng: random.Random, g: int) -> list[WorkloadRequest]:
    draw = rng.random
    header, question_lengths = ctx.mmlu_subjects[int(draw() * MMLU_SUBJECTS)]
    key = f"{ctx.prefix}mmlu/{g}"
    question = new_segment(key, question_lengths.sample(draw))
    answer = ctx.mmlu_answer.sample
    answers = [new_segment(key + suffix, answer(draw)) for suffix in ANSWER_KEYS]
    return [WorkloadRequest("", "mmlu", "choice", [header, question], [], answers, ctx.group(header, key))]


def boolq(ctx: ShapeContext, rng: random.Random, g: int) -> list[WorkloadRequest]:
    u = rng.random()
    questions = 1 if u < BOOLQ_QUESTIONS[0] else 2 if u < BOOLQ_QUESTIONS[1] else 3
    key = f"{ctx.prefix}boolq/{g}"
    passage = new_segment(key, ctx.boolq_passage.sample(rng.random))
    out = []
    for i in range(questions):
        question = new_segment(f"{key}/q{i}", ctx.boolq_question.sample(rng.random))
        out.append(WorkloadRequest("", "boolq", "classify", [passage, ctx.question, question, ctx.answer],
                                   [" yes", " no"], [], ctx.group(passage, question.key)))
    return out


def imdb(ctx: ShapeContext, rng: random.Random, g: int) -> list[WorkloadRequest]:
    key = f"{ctx.prefix}imdb/{g}"
    review = new_segment(key, ctx.imdb_review.sample(rng.random))
    instruction = ctx.imdb_instruction
    return [WorkloadRequest("", "imdb", "classify", [instruction, review, ctx.sentiment],
                            [" positive", " negative"], [], ctx.group(instruction, key))]


def quality(ctx: ShapeContext, rng: random.Random, g: int) -> list[WorkloadRequest]:
    key = f"{ctx.prefix}quality/{g}"
    document = new_segment(key, ctx.quality_document.sample(rng.random))
    out = []
    for i in range(rng.randint(*QUALITY_QUESTIONS)):
        question = new_segment(f"{key}/q{i}", ctx.quality_question.sample(rng.random))
        answers = [new_segment(question.key + suffix, ctx.quality_answer.sample(rng.random))
                   for suffix in ANSWER_KEYS]
        out.append(WorkloadRequest("", "quality", "choice", [document, ctx.question, question], [], answers,
                                   ctx.group(document, question.key)))
    return out


def arxiv(ctx: ShapeContext, rng: random.Random, g: int) -> list[WorkloadRequest]:
    key = f"{ctx.prefix}arxiv/{g}"
    document = new_segment(key, ctx.arxiv_document.sample(rng.random))
    offered = sorted(rng.sample(range(ARXIV_CATEGORIES), rng.randint(*ARXIV_LABELS)))
    return [WorkloadRequest("", "arxiv", "multi", [document], [], [ctx.arxiv_categories[c] for c in offered],
                            ctx.group(document, key))]


SHAPES: dict[str, Shape] = {"moral": moral, "mmlu": mmlu, "boolq": boolq, "imdb": imdb, "quality": quality,
                            "arxiv": arxiv}
"""One shape per workload name (``config.WORKLOADS``)."""
