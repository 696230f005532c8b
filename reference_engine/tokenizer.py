"""Tokenizer (tokenizer.json via `tokenizers`) and chat template (jinja2, as HF renders it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from reference_engine.errors import InvalidRequestError, MissingFileError, UnsupportedModelError


def _token_content(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


@dataclass
class Tokenizer:
    """A thin wrapper: encode/decode through `tokenizers`, chat prompts through the model's
    own chat template, stop ids from generation_config.json / tokenizer_config.json."""

    backend: object  # tokenizers.Tokenizer
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    stop_token_ids: tuple[int, ...]

    @classmethod
    def from_dir(cls, model_dir: str | Path, config_eos: tuple[int, ...] = ()) -> Tokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        model_dir = Path(model_dir)
        tok_path = model_dir / "tokenizer.json"
        if not tok_path.is_file():
            raise MissingFileError(f"{tok_path}: no tokenizer.json in the model directory")
        try:
            backend = HFTokenizer.from_file(str(tok_path))
        except Exception as e:  # tokenizers raises a bare Exception on a malformed file
            raise UnsupportedModelError(f"{tok_path}: cannot be read ({str(e).splitlines()[0]})") from None
        tcfg = _read_json(model_dir / "tokenizer_config.json")
        gcfg = _read_json(model_dir / "generation_config.json")
        template = tcfg.get("chat_template")
        template_file = model_dir / "chat_template.jinja"
        if template is None and template_file.is_file():
            template = template_file.read_text()
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        eos = _token_content(tcfg.get("eos_token"))
        stops: list[int] = []
        gen_eos = gcfg.get("eos_token_id")
        for v in [gen_eos] if isinstance(gen_eos, int) else (gen_eos or []):
            stops.append(int(v))
        if not stops:
            stops.extend(config_eos)
        if not stops and eos is not None and backend.token_to_id(eos) is not None:
            stops.append(backend.token_to_id(eos))
        return cls(
            backend=backend,
            chat_template=template,
            bos_token=_token_content(tcfg.get("bos_token")),
            eos_token=eos,
            stop_token_ids=tuple(dict.fromkeys(stops)),
        )

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise InvalidRequestError("this model has no chat template; send a plain prompt instead")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content", ""), str):
                raise InvalidRequestError(f"messages[{i}] must be an object with a role and string content")
        return _compile(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            tools=None,
        )

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        # HF's apply_chat_template(tokenize=True) renders, then encodes without special tokens.
        return self.encode(self.render_chat(messages, add_generation_prompt), add_special_tokens=False)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UnsupportedModelError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None


_TEMPLATES: dict[str, object] = {}


def _compile(source: str):
    """Compile a chat template the way transformers does: sandboxed, trim_blocks, lstrip_blocks."""
    if source not in _TEMPLATES:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        _TEMPLATES[source] = env.from_string(source)
    return _TEMPLATES[source]
