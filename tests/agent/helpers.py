"""A scripted generation server: hands out canned model turns, so conversations are built by hand."""

from __future__ import annotations

from npu_rl.agent.loops import AgentContext, AgentSettings, TokenOutput

IM_END = 2  # the char tokenizer's end-of-turn id


class ScriptedServer:
    """Replies to sample ``k`` (by the first request it sees from that prompt) with its scripted turns in order."""

    def __init__(self, tokenizer, turns_by_prompt: dict[str, list[str]]):
        self.tokenizer = tokenizer
        self.turns = {k: list(v) for k, v in turns_by_prompt.items()}
        self.requests: list[tuple[list[int], int]] = []

    async def generate(self, prompt_ids, max_tokens):
        self.requests.append((list(prompt_ids), max_tokens))
        text = self.tokenizer.decode(prompt_ids)
        key = next(k for k in self.turns if k in text)
        reply = self.turns[key].pop(0)
        ids = self.tokenizer.encode(reply, add_special_tokens=False) + [IM_END]
        return TokenOutput(ids[:max_tokens], [-0.5] * min(len(ids), max_tokens))


def context(tokenizer, server, tools=None, interactions=None, **settings) -> AgentContext:
    settings.setdefault("response_length", 400)
    return AgentContext(tokenizer=tokenizer, server=server, settings=AgentSettings(**settings), stop_ids=[IM_END],
                        stop_texts=["<|im_end|>"], tools=tools or {}, interactions=interactions or {})
