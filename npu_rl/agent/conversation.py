"""One sample's conversation as tokens: the prompt, then turns appended to a single response with a mask.

Model-generated tokens are appended as generated (mask 1, with their sampling log-probs); every other message (tool
output, a user turn from an interaction) is rendered through the chat template and appended with mask 0 and log-prob
0, so it is context for later turns but never trained on. The tokens of such a message are the difference between
the template's rendering of the conversation with and without it (what the template puts after the model's
end-of-turn token, e.g. ChatML's newline, is added in front), so the token stream is the one the template would
produce, never a re-tokenisation of what the model wrote.

Tools in the prompt: when the tokenizer's chat template takes ``tools`` (Qwen2.5, Llama 3.1, Hermes ...) the
schemas are passed to it; a template that ignores them (SmolLM2) gets them as a block in the system message, in the
hermes format the parser reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

DUMMY_SYSTEM = {"role": "system", "content": "."}


def template_renders_tools(tokenizer) -> bool:
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def tools_system_block(tools: Sequence[dict[str, Any]]) -> str:
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou can call these functions; their signatures are inside <tools></tools>:\n<tools>\n"
            f"{listed}\n</tools>\n\nTo call one, write a JSON object with the function name and its arguments "
            "inside <tool_call></tool_call> tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def with_tools_in_system(messages: list[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    block = tools_system_block(tools)
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{block}"}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def render(tokenizer, messages: list[dict[str, Any]], tools: Optional[Sequence[dict[str, Any]]] = None,
           add_generation_prompt: bool = True, chat_kwargs: Optional[dict[str, Any]] = None) -> str:
    """The chat template's text for ``messages`` (with the tools rendered as the template can)."""
    kwargs = dict(chat_kwargs or {})
    if tools and template_renders_tools(tokenizer):
        kwargs["tools"] = list(tools)
    elif tools:
        messages = with_tools_in_system(messages, tools)
    if not getattr(tokenizer, "chat_template", None):
        text = "\n".join(str(m.get("content", "")) for m in messages)
        return text + "\n" if add_generation_prompt else text
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                         **kwargs)
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
    return text


def truncate_text(text: str, limit: int, side: str) -> str:
    """verl's tool-response truncation (characters): keep the ``left`` / ``right`` part or both ends (``middle``)."""
    if limit <= 0 or len(text) <= limit:
        return text
    marker = "...(truncated)"
    if side == "left":
        return text[:limit] + marker
    if side == "right":
        return marker + text[-limit:]
    if side == "middle":
        half = limit // 2
        return text[:half] + marker + text[len(text) - (limit - half):]
    raise ValueError(f"multi_turn.tool_response_truncate_side={side!r}; expected left, right or middle")


@dataclass
class Conversation:
    tokenizer: Any
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    stop_texts: Sequence[str] = ()
    chat_kwargs: dict[str, Any] = field(default_factory=dict)
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_lengths: list[int] = field(default_factory=list)  # model tokens per assistant turn
    ended_with_stop: bool = False

    def start(self, prompt_ids: Optional[Sequence[int]] = None) -> None:
        """The prompt: given ids (the data set's rendering) or the template's rendering of the messages."""
        if prompt_ids is None:
            text = render(self.tokenizer, self.messages, self.tools, True, self.chat_kwargs)
            prompt_ids = self.tokenizer.encode(text, add_special_tokens=False)
        self.prompt_ids = [int(i) for i in prompt_ids]

    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_generated(self, ids: Sequence[int], logprobs: Optional[Sequence[float]], stop_ids: Sequence[int]) -> str:
        """Append a model turn (mask 1); returns its text without special tokens."""
        ids = [int(i) for i in ids]
        self.response_ids += ids
        self.response_mask += [1] * len(ids)
        self.logprobs += [float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids)
        self.turn_lengths.append(len(ids))
        self.ended_with_stop = bool(ids) and ids[-1] in set(stop_ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": text})
        return text

    def message_tokens(self, new: list[dict[str, Any]]) -> list[int]:
        """The tokens the template adds for ``new`` after the conversation so far, ending with the next assistant
        header (see the module docstring)."""
        base = render(self.tokenizer, self.messages, self.tools, False, self.chat_kwargs)
        full = render(self.tokenizer, self.messages + new, self.tools, True, self.chat_kwargs)
        if full.startswith(base):
            delta = full[len(base):]
            if self.ended_with_stop:  # what the template writes after the end-of-turn token the model produced
                cut = max((base.rfind(s) + len(s) for s in self.stop_texts if s and s in base), default=len(base))
                delta = base[cut:] + delta
        else:  # a template that rewrites earlier turns: render the new messages after a dummy system turn
            head = render(self.tokenizer, [DUMMY_SYSTEM], None, False, self.chat_kwargs)
            delta = render(self.tokenizer, [DUMMY_SYSTEM, *new], None, True, self.chat_kwargs)[len(head):]
        return self.tokenizer.encode(delta, add_special_tokens=False)

    def add_messages(self, new: list[dict[str, Any]]) -> int:
        """Append non-model messages (mask 0); returns the number of tokens added."""
        ids = self.message_tokens(new)
        self.messages += new
        self.response_ids += ids
        self.response_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.ended_with_stop = False
        return len(ids)
