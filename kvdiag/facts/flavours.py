"""Fact flavours: who the entities are, which relations they have, how a value reads.

Each relation draws a value as a pair (natural English string, canary tokens). Canary
tokens are letters-only words (the canary's byte-level BPE splits digits and punctuation),
so numbers are spelled ("fortytwo"). The canary tokens of one value are distinct (the
canary copies a value by matching the token before the one it emits, so a repeated token
would be ambiguous) and come from `VALUE_WORDS`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

ValueDraw = Callable[[random.Random], tuple[str, tuple[str, ...]]]


_ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
         "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
         "eighteen", "nineteen")
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


def spell(n: int) -> tuple[str, ...]:
    """Canary tokens of 0 <= n <= 999: one word below 100 ("fortytwo"), else with "hundred"."""
    if n < 20:
        return (_ONES[n],)
    if n < 100:
        return (_TENS[n // 10] + (_ONES[n % 10] if n % 10 else ""),)
    rest = spell(n % 100) if n % 100 else ()
    return (_ONES[n // 100], "hundred", *rest)


@dataclass(frozen=True)
class Relation:
    name: str  # natural, e.g. "termination notice"
    code: str  # canary key suffix, capitalised, e.g. "NOTICE" (key "northwindNotice")
    draw: ValueDraw


@dataclass(frozen=True)
class Flavour:
    name: str
    entities: tuple[tuple[str, str], ...]  # (natural name, canary slug)
    relations: tuple[Relation, ...]


def _money(lo: int, hi: int, unit: str) -> ValueDraw:
    def draw(rng: random.Random) -> tuple[str, tuple[str, ...]]:
        while True:
            a = rng.randint(lo, hi)
            toks = ("usd", *spell(a), unit)
            if len(set(toks)) == len(toks):
                return f"${a} {unit}", toks

    return draw


def _decimal(lo: int, hi: int, prefix: tuple[str, ...], suffix: tuple[str, ...],
             fmt: str, cents: bool = False) -> ValueDraw:
    """a.b with a in [lo, hi]; b one digit (or two when cents). fmt gets {a} and {b}."""

    def draw(rng: random.Random) -> tuple[str, tuple[str, ...]]:
        while True:
            a = rng.randint(lo, hi)
            b = rng.randint(10, 99) if cents else rng.randint(1, 9)
            toks = (*prefix, *spell(a), "point", *spell(b), *suffix)
            if len(set(toks)) == len(toks):  # "four point four" would repeat a token
                return fmt.format(a=a, b=b), toks

    return draw


def _count(choices: tuple[int, ...], unit: str, fmt: str, prefix: tuple[str, ...] = ()) -> ValueDraw:
    def draw(rng: random.Random) -> tuple[str, tuple[str, ...]]:
        while True:
            n = rng.choice(choices)
            toks = (*prefix, *spell(n), unit)
            if len(set(toks)) == len(toks):
                return fmt.format(n=n), toks

    return draw


def _pick(options: tuple[tuple[str, tuple[str, ...]], ...]) -> ValueDraw:
    def draw(rng: random.Random) -> tuple[str, tuple[str, ...]]:
        return rng.choice(options)

    return draw


def _bp(rng: random.Random) -> tuple[str, tuple[str, ...]]:
    while True:
        s, d = rng.randint(100, 179), rng.randint(60, 99)
        toks = (*spell(s), "over", *spell(d), "mmhg")
        if len(set(toks)) == len(toks):
            return f"{s}/{d} mmHg", toks


def _medication(rng: random.Random) -> tuple[str, tuple[str, ...]]:
    drug = rng.choice((("metformin", "metformin"), ("lisinopril", "lisinopril"),
                       ("atorvastatin", "statin"), ("amlodipine", "amlodipine"),
                       ("levothyroxine", "thyroxine"), ("omeprazole", "omeprazole"),
                       ("sertraline", "sertraline"), ("warfarin", "warfarin")))
    dose = rng.choice((5, 10, 20, 25, 40, 50, 75, 80, 90))
    freq = rng.choice(("once", "twice"))
    toks = (drug[1], *spell(dose), "mg", freq, "daily")
    return f"{drug[0]} {dose} mg {freq} daily", toks


FINANCIAL = Flavour(
    "financial",
    entities=(("Acme Corp", "acme"), ("Globex Inc", "globex"), ("Initech", "initech"),
              ("Vandelay Industries", "vandelay"), ("Helios Energy", "helios"),
              ("Orion Robotics", "orion"), ("Cobalt Mining", "cobalt"), ("Juniper Foods", "juniper"),
              ("Atlas Freight", "atlas"), ("Zephyr Airlines", "zephyr"), ("Quantum Retail", "quantum"),
              ("Sable Pharma", "sable"), ("Nimbus Cloud", "nimbus"), ("Pioneer Steel", "pioneer"),
              ("Redwood Bank", "redwood"), ("Lumen Media", "lumen")),
    relations=(
        Relation("revenue", "REV",
                 _decimal(1, 99, ("usd",), ("billion",), "${a}.{b} billion")),
        Relation("net income", "NET", _money(10, 199, "million")),
        Relation("operating margin", "MRG",
                 _decimal(2, 39, (), ("percent",), "{a}.{b} %")),
        Relation("earnings per share", "EPS",
                 _decimal(0, 9, ("usd",), (), "${a}.{b}", cents=True)),
        Relation("free cash flow", "FCF", _money(10, 199, "million")),
        Relation("capital expenditure", "CAP", _money(10, 199, "million")),
        Relation("headcount", "STAFF",
                 _count(tuple(range(1, 200)), "thousand", "{n},000 employees")),
        Relation("dividend per share", "DIV",
                 _decimal(0, 4, ("usd",), (), "${a}.{b}", cents=True)),
    ),
)

LEGAL = Flavour(
    "legal",
    entities=(("Northwind Ltd", "northwind"), ("Contoso LLC", "contoso"), ("Fabrikam Inc", "fabrikam"),
              ("Tailspin Toys", "tailspin"), ("Woodgrove Bank", "woodgrove"), ("Litware Inc", "litware"),
              ("Proseware Ltd", "proseware"), ("Adventure Works", "adventure"),
              ("Wingtip Partners", "wingtip"), ("Lucerne Publishing", "lucerne"),
              ("Margie Travel", "margie"), ("Alpine Ski House", "alpine"), ("Coho Winery", "coho"),
              ("Fourth Coffee", "fourth"), ("Trey Research", "trey"),
              ("Blue Yonder Airlines", "yonder")),
    relations=(
        Relation("termination notice", "NOTICE",
                 _count((30, 45, 60, 90, 120, 180), "days", "{n} days")),
        Relation("payment terms", "PAY",
                 _count((15, 30, 45, 60, 90), "days", "net {n} days", prefix=("net",))),
        Relation("liability cap", "CAP", _money(1, 50, "million")),
        Relation("governing law", "LAW", _pick(tuple(
            (name, (slug,)) for name, slug in (
                ("Delaware", "delaware"), ("New York", "newyork"), ("California", "california"),
                ("Texas", "texas"), ("England and Wales", "england"), ("Scotland", "scotland"),
                ("Ontario", "ontario"), ("Singapore", "singapore"), ("Ireland", "ireland"),
                ("Germany", "germany"))))),
        Relation("renewal term", "TERM",
                 _count((6, 12, 18, 24, 36), "months", "{n} months")),
        Relation("confidentiality period", "CONF",
                 _count((2, 3, 5, 7, 10), "years", "{n} years")),
        Relation("late payment interest", "INT",
                 _decimal(0, 3, (), ("percent", "per", "month"), "{a}.{b} % per month")),
        Relation("non-compete period", "NCP",
                 _count((6, 9, 12, 18, 24), "months", "{n} months")),
    ),
)

CLINICAL = Flavour(
    "clinical",
    # canary slugs are letters only: digits 0-9 become a-j (P-0193 -> "pabjd")
    entities=tuple((f"patient P-{n:04d}", "p" + "".join("abcdefghij"[int(c)] for c in f"{n:04d}"))
                   for n in (
        193, 247, 318, 452, 516, 634, 781, 829, 907, 1046, 1152, 1238, 1375, 1420, 1563, 1694)),
    relations=(
        Relation("HbA1c", "HBA", _decimal(5, 11, (), ("percent",), "{a}.{b} %")),
        Relation("blood pressure", "BP", _bp),
        Relation("LDL cholesterol", "LDL", _decimal(1, 6, (), ("mmol",), "{a}.{b} mmol/L")),
        Relation("body weight", "WEIGHT", _count(tuple(range(45, 141)), "kg", "{n} kg")),
        Relation("eGFR", "EGFR", _count(tuple(range(15, 121)), "mlmin", "{n} mL/min")),
        Relation("diagnosis", "DX", _pick((
            ("type 2 diabetes", ("type", "two", "diabetes")), ("hypertension", ("hypertension",)),
            ("asthma", ("asthma",)), ("atrial fibrillation", ("atrial", "fibrillation")),
            ("chronic kidney disease", ("chronic", "kidney", "disease")),
            ("hypothyroidism", ("hypothyroid",)), ("heart failure", ("heart", "failure")),
            ("rheumatoid arthritis", ("rheumatoid", "arthritis")), ("migraine", ("migraine",)),
            ("anaemia", ("anaemia",))))),
        Relation("medication", "MED", _medication),
        Relation("allergy", "ALLERGY", _pick(tuple((w, (w,)) for w in (
            "penicillin", "sulfonamides", "latex", "peanuts", "aspirin", "codeine",
            "shellfish", "ibuprofen")))),
    ),
)

FLAVOUR_TABLE: dict[str, Flavour] = {f.name: f for f in (FINANCIAL, LEGAL, CLINICAL)}


def _value_words() -> tuple[str, ...]:
    """Every token a value can use, in a fixed order (the canary vocabulary is built from it)."""
    numbers = [w for n in range(100) for w in spell(n)]
    words = ("hundred", "usd", "point", "billion", "million", "thousand", "employees", "percent",
             "per", "month", "months", "days", "years", "net", "over", "mmhg", "mmol", "kg",
             "mlmin", "mg", "once", "twice", "daily", "metformin", "lisinopril", "statin",
             "amlodipine", "thyroxine", "omeprazole", "sertraline", "warfarin", "type",
             "diabetes", "hypertension", "asthma", "atrial", "fibrillation", "chronic", "kidney",
             "disease", "hypothyroid", "heart", "failure", "rheumatoid", "arthritis",
             "migraine", "anaemia", "penicillin", "sulfonamides", "latex", "peanuts", "aspirin",
             "codeine", "shellfish", "ibuprofen", "delaware", "newyork", "california", "texas",
             "england", "scotland", "ontario", "singapore", "ireland", "germany")
    return (*numbers, *words)


VALUE_WORDS: tuple[str, ...] = _value_words()

