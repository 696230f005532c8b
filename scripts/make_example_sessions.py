"""Write examples/sessions.jsonl (OpenAI chat format) and examples/sessions.sharegpt.jsonl (the
same conversations in ShareGPT form): small, deterministic conversations of 12 rounds in
natural English, with numbers, dates, names, quoted titles and code, as a user's own traffic
would have them (docs/own-sessions.md). Run: python scripts/make_example_sessions.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

ROUNDS = 12
COMPANIES = ("Northwind Traders", "Globex Corporation", "Initech", "Umbrella Logistics",
             "Stark Analytics", "Wayne Freight")
CITIES = ("Lisbon", "Osaka", "Toronto", "Nairobi", "Valparaiso", "Tallinn")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")
TITLES = ("The Quiet Ledger", "Notes on Paged Memory", "A Field Guide to Contracts",
          "Rivers of Revenue", "The Long Context")
FUNCS = ("parse_invoice", "net_margin", "days_between", "rolling_mean", "quarter_of")


def date(rng: random.Random) -> str:
    return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}, {rng.randint(2019, 2026)}"


def money(rng: random.Random) -> str:
    return f"${rng.randint(1, 90)}.{rng.randint(0, 9)} million"


def code(rng: random.Random, name: str) -> str:
    a, b = rng.sample("xyzuvw", 2)
    return (f"```python\ndef {name}({a}, {b}):\n    \"\"\"{name.replace('_', ' ')}.\"\"\"\n"
            f"    return round(({a} - {b}) / max({b}, 1), {rng.randint(2, 4)})\n```")


def turn(rng: random.Random, r: int, company: str, city: str) -> tuple[str, str]:
    """(user, assistant) of round r: each round states or asks something new."""
    kind = r % 4
    if kind == 0:
        when, amount = date(rng), money(rng)
        return (f"On {when}, {company} reported revenue of {amount} from its {city} office. "
                f"Please keep that figure in mind for later.",
                f"Noted: {company} reported {amount} in revenue from {city} on {when}.")
    if kind == 1:
        name = rng.choice(FUNCS)
        return (f"Can you write a small Python function called {name} that compares two numbers?",
                f"Here is one:\n\n{code(rng, name)}\n\nIt returns the relative difference, "
                f"rounded.")
    if kind == 2:
        title, pages = rng.choice(TITLES), rng.randint(120, 480)
        return (f"Our analyst cited \"{title}\" ({pages} pages) in the memo. Who published it, "
                f"and when?",
                f"\"{title}\" runs to {pages} pages; the memo gives its publication date as "
                f"{date(rng)}, and its publisher as {rng.choice(COMPANIES)}.")
    growth = rng.randint(2, 19)
    return (f"If revenue in {city} grows {growth}% a year, what will it be in {rng.randint(2, 5)} "
            f"years? Show the arithmetic step by step.",
            f"Compounding at {growth}% a year multiplies revenue by {1 + growth / 100:.2f} each "
            f"year; apply that once per year to the figure above.")


def conversation(seed: int) -> list[dict]:
    rng = random.Random(f"example:{seed}")
    company, city = COMPANIES[seed % len(COMPANIES)], CITIES[seed % len(CITIES)]
    messages = [{"role": "system", "content": f"You are a careful financial assistant for "
                                              f"{company}. Answer with exact figures and dates."}]
    for r in range(ROUNDS):
        user, assistant = turn(rng, r, company, city)
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return messages


def sharegpt(messages: list[dict]) -> list[dict]:
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    return [{"from": names[m["role"]], "value": m["content"]} for m in messages]


def main(out: Path = Path("examples"), conversations: int = 6) -> None:
    out.mkdir(parents=True, exist_ok=True)
    chats = [conversation(s) for s in range(conversations)]
    (out / "sessions.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    (out / "sessions.sharegpt.jsonl").write_text(
        "".join(json.dumps({"conversations": sharegpt(c)}) + "\n" for c in chats))
    print(f"wrote {out / 'sessions.jsonl'} and {out / 'sessions.sharegpt.jsonl'}: "
          f"{conversations} conversations x {ROUNDS} rounds")


if __name__ == "__main__":
    main()
