"""Knowledge bases and fact sessions, deterministic by seed, in two styles.

`canary` sessions use only the canary model's vocabulary (one word = one token, so every
length is exact); `natural` sessions are English sentences for real chat models, with the
knowledge base kept beside them for fact-checking.
"""

from kvdiag.facts.knowledge import FLAVOURS, Fact, KnowledgeBase, make_knowledge_base
from kvdiag.facts.session import Round, Session, SessionPlan, build_session
from kvdiag.facts.styles import STYLES

__all__ = ["FLAVOURS", "STYLES", "Fact", "KnowledgeBase", "Round", "Session", "SessionPlan", "build_session",
           "make_knowledge_base"]
