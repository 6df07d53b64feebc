"""The embedded backend, for real: SmolLM2-135M behind the loopback endpoint, through the real openai client."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import subprocess
import time
import sys
import weakref
from pathlib import Path

import art
import httpx
import openai
import pytest
import torch

from summrl.backends.embedded import EmbeddedBackend
from summrl.backends.embedded.backend import has_reward_variance
from summrl.data import load_splits
from summrl.prompt import SummaryPrompt
from summrl.rollout import rollout, summary_of
from tests.conftest import SAMPLE, compose_config

FACTS = SummaryPrompt("facts", 350)  # experiment=local's prompt

pytestmark = pytest.mark.slow
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def make(tmp: Path, name: str = "embedded-test"):
    config = compose_config(["experiment=local"])
    backend = EmbeddedBackend(config.backend, model=config.model, path=str(tmp / "art"))
    model = art.TrainableModel(name=name, project="summrl-tests", base_model=config.model.base_model, report_metrics=[])
    return config, backend, model


@pytest.fixture(scope="module")
def session(loop, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("embedded")
    config, backend, model = make(tmp)
    loop.run_until_complete(model.register(backend))
    val, train = load_splits(config.dataset)
    yield backend, model, train, tmp
    loop.run_until_complete(backend.close())


def test_rollout_through_the_openai_client_returns_a_trainable_trajectory(loop, session):
    backend, model, docs, _ = session
    trajectory = loop.run_until_complete(rollout(model, docs[0], prompt=FACTS, max_tokens=MAX_TOKENS, temperature=1.0))
    choice = trajectory.messages_and_choices[-1]
    assert isinstance(choice, openai.types.chat.chat_completion.Choice)
    assert summary_of(trajectory) and trajectory.metrics["word_count"] == len(summary_of(trajectory).split())
    tokens = choice.logprobs.content
    assert 0 < len(tokens) <= MAX_TOKENS
    assert all(t.token.startswith("token_id:") and t.logprob <= 0 for t in tokens)
    assert model.inference_base_url.startswith("http://127.0.0.1:")


def test_logprob_bytes_of_tokens_that_hold_part_of_a_character_join_into_the_text(loop, session):
    """OpenAI's logprobs ``bytes`` are each token's own bytes. Each token was decoded alone, so one holding part of an
    emoji's or a CJK character's UTF-8 came back as U+FFFD's bytes, and joined they were not the reply (found by this
    stop's endpoint audit). Greedy replies end in the prompt's characters, checked through the server as well."""
    backend, model, docs, _ = session
    engine = backend.engine
    text = "Repeat: 😀 日本語 café"
    tokens = engine.tokenizer.encode(text, add_special_tokens=False)
    assert any("\ufffd" in engine.tokenizer.decode([t]) for t in tokens)  # some hold part of a character
    assert bytes(b for t in tokens for b in engine.token_bytes(t)) == text.encode("utf-8")
    client = model.openai_client()
    reply = loop.run_until_complete(client.chat.completions.create(
        model=model.get_inference_name(), messages=[{"role": "user", "content": f"Say exactly: {text}"}],
        temperature=0, max_tokens=16, logprobs=True))
    choice = reply.choices[0]
    content = [t for t in choice.logprobs.content if int(t.token.split(":")[1]) not in engine.eos_ids]
    assert bytes(b for t in content for b in t.bytes).decode("utf-8", errors="replace") == choice.message.content


def test_the_endpoint_reads_developer_as_system_and_refuses_what_it_does_not_implement(loop, session):
    """logit_bias, tools and presence_penalty were accepted and ignored (the reply was not what was asked for), and a
    developer message became a turn of its own after SmolLM2's default system prompt: 45 prompt tokens where the
    system message gave 23 (found by this stop's endpoint audit). summrl.serve refuses the same parameters."""
    backend, model, docs, _ = session
    client = model.openai_client()

    async def ask(role="system", **kwargs):
        return await client.chat.completions.create(
            model=model.get_inference_name(), temperature=0, max_tokens=1,
            messages=[{"role": role, "content": "Answer briefly."}, {"role": "user", "content": "Name a color."}],
            **kwargs)

    system, developer = (loop.run_until_complete(ask(role)) for role in ("system", "developer"))
    assert developer.usage.prompt_tokens == system.usage.prompt_tokens
    for extra, named in (({"logit_bias": {"33": -100}}, "logit_bias"), ({"presence_penalty": 1.5}, "presence_penalty"),
                         ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                           "tool_choice": "required"}, "tools, tool_choice")):
        with pytest.raises(openai.BadRequestError, match=f"{named}: not supported by this endpoint"):
            loop.run_until_complete(ask(**extra))
    with pytest.raises(openai.BadRequestError, match="must be one of system, user, assistant, developer"):
        loop.run_until_complete(ask("robot"))
    assert loop.run_until_complete(ask(presence_penalty=0)).choices  # a zero asks for nothing
    # a message's tool call went to the template, which never read it (an audit); echoed empty, it asks for nothing
    called = {"role": "assistant", "content": "Red.", "tool_calls": [{"id": "c1", "type": "function",
                                                                       "function": {"name": "f", "arguments": "{}"}}]}
    for message, refused in ((called, True), ({**called, "tool_calls": None, "refusal": None}, False)):
        request = client.chat.completions.create(model=model.get_inference_name(), max_tokens=1, messages=[
            {"role": "user", "content": "Name a color."}, message, {"role": "user", "content": "Another."}])
        if refused:
            with pytest.raises(openai.BadRequestError, match="tool_calls not supported .this server has no tools."):
                loop.run_until_complete(request)
        else:
            assert loop.run_until_complete(request).choices


def test_a_summary_budget_past_the_context_is_refused_before_generating_as_the_server_would_refuse_it(loop, session):
    """check_context (run by training once the model loads) and the server agree on the longest prompt's room."""
    from summrl.errors import ConfigError
    from summrl.rollout import check_context

    backend, model, docs, _ = session
    engine = backend.engine
    longest = max(docs, key=lambda d: len(engine.encode_chat(FACTS.messages(d))))
    room = engine.context_length - len(engine.encode_chat(FACTS.messages(longest)))
    check_context(engine, docs, FACTS, room)  # fits exactly
    with pytest.raises(ConfigError, match=rf"trainer\.max_summary_tokens={room + 1}: .* prompt \(document "
                                          rf"{longest.id}\) .* at most {room} tokens: set trainer\.max_summary_tokens"):
        check_context(engine, docs, FACTS, room + 1)
    with pytest.raises(openai.BadRequestError, match=rf"{room + 1} in the completion\).*\(at most {room} here"):
        loop.run_until_complete(rollout(model, longest, prompt=FACTS, max_tokens=room + 1, temperature=1.0))


def test_concurrent_requests_are_batched_and_share_a_prompt(loop, session, monkeypatch):
    backend, model, docs, _ = session
    engine = backend.engine
    prefills = []  # (rows, distinct prompts) of each prefill
    prefill = engine._prefill
    monkeypatch.setattr(engine, "_prefill", lambda unique, row_of, *a, **kw: (
        prefills.append((len(row_of), len(unique))), prefill(unique, row_of, *a, **kw))[1])
    before = len(backend._batcher.batch_sizes)
    group = loop.run_until_complete(art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout(model, d, prompt=FACTS, max_tokens=MAX_TOKENS, temperature=1.0) for _ in range(4))
         for d in docs[:2]], pbar_desc=None))
    assert sum(len(g.trajectories) for g in group) == 8
    assert max(backend._batcher.batch_sizes[before:]) > 1  # arrived together, generated together
    # rows with the same prompt share its prefill: fewer prompts prefilled than rows generated
    assert sum(rows for rows, _ in prefills) == 8 and sum(distinct for _, distinct in prefills) < 8


def test_sampling_parameters_are_honoured(loop, session):
    backend, model, docs, _ = session
    client = model.openai_client()
    messages = [{"role": "user", "content": "List three colors."}]

    async def ask(**kwargs):
        return await client.chat.completions.create(model=model.get_inference_name(), messages=messages, **kwargs)

    async def twice():
        return await asyncio.gather(ask(temperature=0, max_tokens=12), ask(temperature=0, max_tokens=12))

    greedy = loop.run_until_complete(twice())
    assert greedy[0].choices[0].message.content == greedy[1].choices[0].message.content
    short = loop.run_until_complete(ask(temperature=0, max_tokens=3, logprobs=True))
    assert short.usage.completion_tokens <= 3 and short.choices[0].finish_reason == "length"
    no_logprobs = loop.run_until_complete(ask(temperature=0, max_tokens=3))
    assert no_logprobs.choices[0].logprobs is None
    several = loop.run_until_complete(ask(temperature=1.0, max_tokens=4, n=3))
    assert len(several.choices) == 3


def test_a_seeded_request_repeats_its_reply_when_sent_the_same_way_whatever_the_unseeded_rows_draw(loop, session):
    """The promise the README makes (and vLLM's): the same seeded request, sent the same way (alone, or in a batch of
    the same shape), gets the same reply, whatever the unseeded rows beside it draw: each row samples with its own
    generator. Not promised: the same reply alone and in a crowd. A row's logits vary around 1e-6 with the batch's
    row count (a 1-row product runs another kernel), which can flip a near-tied draw: on a Zen 3 (AVX2) machine this
    prompt and seed gave "SmolVal..." alone and "Smolien..." beside 1 or 3 other rows (third token, logprob -9.3 vs
    -11.7)."""
    backend, model, docs, _ = session
    client = model.openai_client()

    async def ask(content, seed=None):
        reply = await client.chat.completions.create(
            model=model.get_inference_name(), messages=[{"role": "user", "content": content}], temperature=1.0,
            max_tokens=12, **({} if seed is None else {"seed": seed}))
        return reply.choices[0].message.content

    async def crowded(seed):  # batched with unseeded requests (random draws each time) and other prompts
        replies = await asyncio.gather(ask("Name a fruit."), ask("List three colors.", seed), ask("Say hi."),
                                       ask("List three colors."))
        return replies[1], replies[3]

    alone = [loop.run_until_complete(ask("List three colors.", seed=1234)) for _ in range(2)]
    assert alone[0] == alone[1]
    before = len(backend._batcher.batch_sizes)
    crowds = [loop.run_until_complete(crowded(1234)) for _ in range(3)]
    assert backend._batcher.batch_sizes[before:] == [4, 4, 4]  # the seeded request shared a batch
    assert len({seeded for seeded, _ in crowds}) == 1  # its reply held ...
    assert len({unseeded for _, unseeded in crowds}) > 1  # ... while its unseeded neighbour drew anew each time
    others = {loop.run_until_complete(ask("List three colors.", seed=s)) for s in (1, 2, 3, 4)}
    assert len(others) > 1  # the seed, not the prompt, fixes the reply


def test_a_batch_is_sampled_in_one_order_whatever_order_its_requests_arrive_in(loop, session):
    """A row's logprobs vary (around 1e-6) with its place in the batch, and the update reads them: the batcher sorts
    each batch, so the same requests arriving in another order get the same logprobs, and training stays the same."""
    backend, model, _, _ = session
    client = model.openai_client()

    async def ask(content, seed):
        reply = await client.chat.completions.create(
            model=model.get_inference_name(), messages=[{"role": "user", "content": content}], temperature=1.0,
            max_tokens=8, seed=seed, logprobs=True)
        return [t.logprob for t in reply.choices[0].logprobs.content]

    async def together(requests):
        return await asyncio.gather(*(ask(content, seed) for content, seed in requests))

    requests = [("Name a fruit.", 11), ("List three colors.", 12), ("Say hi.", 13)]
    before = len(backend._batcher.batch_sizes)
    forward = loop.run_until_complete(together(requests))
    backward = loop.run_until_complete(together(requests[::-1]))[::-1]
    assert backend._batcher.batch_sizes[before:] == [3, 3]  # each time, one batch of the three
    assert forward == backward


def test_a_streamed_chat_sends_each_choices_text_as_it_is_drawn_and_ends_as_the_reply_does(loop, session):
    """stream=true, as OpenAI's clients and chat UIs send it, was a 400. Each choice's text comes in pieces as its
    tokens are drawn, and joined it is the reply the same request gets unstreamed; the usage chunk counts the same."""
    backend, model, _, _ = session
    client = model.openai_client()
    ask = dict(model=model.get_inference_name(), messages=[{"role": "user", "content": "List three colors."}],
               temperature=1.0, max_tokens=12, n=2, seed=5)

    async def streamed() -> tuple:
        texts, pieces, finish, usage = {0: "", 1: ""}, {0: 0, 1: 0}, {}, None
        async for chunk in await client.chat.completions.create(**ask, stream=True,
                                                                 stream_options={"include_usage": True}):
            usage = chunk.usage or usage
            for choice in chunk.choices:
                if choice.delta.content:
                    texts[choice.index] += choice.delta.content
                    pieces[choice.index] += 1
                if choice.finish_reason:
                    finish[choice.index] = choice.finish_reason
        return texts, pieces, finish, usage

    texts, pieces, finish, usage = loop.run_until_complete(streamed())
    whole = loop.run_until_complete(client.chat.completions.create(**ask))
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finish == {c.index: c.finish_reason for c in whole.choices}
    assert usage.completion_tokens == whole.usage.completion_tokens and usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(count > 1 for count in pieces.values())  # in pieces as drawn, not the whole text in one chunk
    with pytest.raises(openai.BadRequestError, match="logprobs: not supported with stream=true"):
        loop.run_until_complete(client.chat.completions.create(**ask, stream=True, logprobs=True))
    # each token's alternatives were answered as an empty list (found by this stop's server audit)
    with pytest.raises(openai.BadRequestError, match="top_logprobs: not supported here"):
        loop.run_until_complete(client.chat.completions.create(**ask, logprobs=True, top_logprobs=3))


def test_a_stop_sequence_ends_the_reply_before_it_streamed_or_not(loop, session):
    """OpenAI's ``stop`` (up to 4 sequences) was a 400. The row stops generating once one is drawn; the text ends
    before it, with finish_reason "stop"; a stream never sends any of it, though it may begin mid-token."""
    backend, model, _, _ = session
    client = model.openai_client()
    ask = dict(model=model.get_inference_name(), messages=[{"role": "user", "content": "List three colors."}],
               temperature=0, max_tokens=24)
    whole = loop.run_until_complete(client.chat.completions.create(**ask))
    text = whole.choices[0].message.content
    middle = len(text) // 2
    stop = text[middle:middle + 3]  # begins wherever the middle falls, inside a token or not
    assert len(stop) == 3 and text.find(stop) == middle, text

    async def streamed() -> tuple:
        pieces, finish = [], None
        async for chunk in await client.chat.completions.create(**ask, stop=[stop, "never drawn"], stream=True):
            for choice in chunk.choices:
                pieces += [choice.delta.content] if choice.delta.content else []
                finish = choice.finish_reason or finish
        return pieces, finish

    stopped = loop.run_until_complete(client.chat.completions.create(**ask, stop=stop))
    assert stopped.choices[0].message.content == text[:middle] and stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens < whole.usage.completion_tokens  # it stopped generating there
    pieces, finish = loop.run_until_complete(streamed())
    assert "".join(pieces) == text[:middle] and finish == "stop"
    with pytest.raises(openai.BadRequestError, match="at most 4 sequences"):  # as summrl.serve refuses it
        loop.run_until_complete(client.chat.completions.create(**ask, stop=["a", "b", "c", "d", "e"]))


@pytest.mark.parametrize("pieces, sent, stopped", [
    (["Red, gr", "een. E", "ND here"], ["Red, gr", "een. ", ""], True),  # begun in one piece, completed in the next
    (["Red E", "N", "ough"], ["Red ", "", "ENough"], False),  # looked like its start, then was not
    (["Red E", "N"], ["Red ", "EN"], False),  # the reply ended inside a possible start: all of it is sent
    (["Say STOP", " now"], ["Say ", ""], True),  # the other sequence
])
def test_a_stream_holds_back_what_may_begin_a_stop_sequence_and_never_sends_one(pieces, sent, stopped):
    from summrl.backends.embedded.server import _Held

    held = _Held(("END", "STOP"))
    released = [held.release(piece) for piece in pieces]
    if not stopped:
        released[-1] += held.release("", last=True)
    assert released == sent and held.stopped == stopped


def test_a_streamed_text_is_the_whole_texts_decoding_however_its_characters_split_into_tokens(session):
    """Characters that span byte tokens (accents, CJK, emoji) wait for their last byte; the pieces join to the text.
    Spaces before punctuation are kept, as vLLM keeps them: SmolLM2's tokenizer asks for a clean-up that turned
    "x 's y" into "x's y" whole and "x ' y" streamed, the "s" lost."""
    from summrl.backends.embedded.server import _Text

    engine = session[0].engine
    for text in ("naïve café — 日本語の要約 😀👍🏽 done.", "  two leading spaces\n\nand a\tTab", "Ünïcödé",
                 "x 's y", "He said ' hi ' .", "I don 't know , do you ?"):
        ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
        streamed = _Text(engine)
        pieces = [streamed.add(token) for token in ids]
        assert not any("\ufffd" in piece for piece in pieces)
        assert "".join(pieces) + streamed.rest(ids) == engine.decode(ids) == text
        assert sum(bool(piece) for piece in pieces) > len(text.split()) // 2  # in pieces, not held to the end


def test_a_code_models_infilling_markers_are_plain_text_to_smollm2(loop, session):
    """transformers read SmolLM2's GGUF tokenizer as CodeLlama's: "<FILL_ME>" and "▁<PRE>" became ids past the
    embedding (a request holding one raised IndexError, failing every request batched with it), and after one the
    tokenizer encoded every later text with "▁" for its spaces. They are text, as SmolLM2's own tokenizer reads them;
    eos is <|im_end|>, as in the file (it was read from bos)."""
    backend, model, _, _ = session
    engine = backend.engine
    asked = [{"role": "user", "content": "Summarize: the cat sat on the mat."}]
    before = engine.encode_chat(asked)
    text = "Code models fill <FILL_ME> between ▁<PRE> and ▁<SUF> markers."
    ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert max(ids) < engine.model.get_base_model().config.vocab_size and engine.decode(ids) == text
    reply = loop.run_until_complete(model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=[{"role": "user", "content": text}], max_tokens=4, temperature=0))
    assert reply.choices[0].message.content
    assert engine.encode_chat(asked) == before  # the same tokens as before the markers were read
    assert (len(engine.tokenizer), engine.tokenizer.eos_token, engine.eos_ids) == (49152, "<|im_end|>", [2])


def test_a_stream_its_client_closes_stops_generating(loop, session, caplog):
    """A chat UI's stop button closes the stream: its row stops where it is, and the engine is free for the next."""
    backend, model, _, _ = session
    client = model.openai_client()
    ask = dict(model=model.get_inference_name(), messages=[{"role": "user", "content": "Tell a long story."}],
               temperature=1.0, max_tokens=64, seed=3)
    whole = loop.run_until_complete(client.chat.completions.create(**ask))
    assert whole.choices[0].finish_reason == "length"  # unstopped, it runs all 64 tokens

    async def stop_after_two_pieces() -> None:
        stream, pieces = await client.chat.completions.create(**ask, stream=True), 0
        async for chunk in stream:
            pieces += bool(chunk.choices and chunk.choices[0].delta.content)
            if pieces == 2:
                break
        await stream.close()

    with caplog.at_level("INFO", logger="summrl.backends.embedded.server"):
        loop.run_until_complete(stop_after_two_pieces())
        deadline = time.monotonic() + 30
        while not (ran := re.findall(r"1 of 1 rows were abandoned .* the call ran (\d+) of 64 tokens", caplog.text)):
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.1)
    assert int(ran[-1]) < 64


def test_a_burst_over_the_batch_size_runs_as_the_same_generate_calls_whatever_its_arrival_order():
    """A row's logits depend on the rows generated beside it (around 1e-5: enough to flip a near-tied token), so a
    burst larger than max_batch_size (a val pass of 24 documents x 4 summaries is 96 rows, generate calls take 64) is
    sorted before it is split: the same requests arriving in any order make the same calls, and a repeated run or
    another arm of a sweep samples the same summaries. A prompt's rows stay together (they share its prefill)."""
    import random

    from summrl.backends.embedded.engine import Completion, SamplingParams
    from summrl.backends.embedded.server import Batcher

    class Engine:
        def __init__(self):
            self.calls = []

        def generate(self, prompts, params, use_lora=True, seeds=None, rows=None):
            self.calls.append(list(zip(seeds, prompts)))
            return [Completion([1], [0.0], "stop", len(p)) for p in prompts]

    requests = [(seed, [seed % 3]) for seed in range(10)]  # 3 prompts, 4 + 3 + 3 rows

    def calls_for(order):
        engine = Engine()
        batcher = Batcher(engine, max_batch_size=4, window_s=0.2)

        async def burst():
            await asyncio.gather(*(batcher.enqueue(prompt, SamplingParams(max_tokens=1), True, seed)
                                   for seed, prompt in order))
        try:
            asyncio.run(burst())
        finally:
            batcher.close()
        return engine.calls

    shuffled = requests[:]
    random.Random(3).shuffle(shuffled)
    in_order = calls_for(requests)
    assert in_order == [[(0, [0]), (3, [0]), (6, [0]), (9, [0])], [(1, [1]), (4, [1]), (7, [1]), (2, [2])],
                        [(5, [2]), (8, [2])]]
    assert calls_for(shuffled) == calls_for(requests[::-1]) == in_order


def test_a_call_that_ends_after_its_requesters_loop_closed_is_dropped_and_the_batcher_goes_on(monkeypatch):
    """An interrupted benchmark stops its server (and the server's event loop) while a generate call runs: the
    batcher's thread then died on 'Event loop is closed', printing its traceback before the one-line message."""
    import threading

    from summrl.backends.embedded.engine import Completion, SamplingParams
    from summrl.backends.embedded.server import Batcher

    started, release = threading.Event(), threading.Event()

    class Engine:
        def generate(self, prompts, params, use_lora=True, seeds=None, rows=None):
            started.set()
            release.wait(10)
            return [Completion([1], [0.0], "stop", len(p)) for p in prompts]

    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    batcher = Batcher(Engine(), max_batch_size=4, window_s=0.01)
    try:
        async def asked():
            batcher.enqueue([1, 2], SamplingParams(max_tokens=1), True, 0)
            await asyncio.to_thread(started.wait, 10)

        gone = asyncio.new_event_loop()
        gone.run_until_complete(asked())
        gone.close()  # the server stopped mid-call
        release.set()

        async def next_request():
            return await asyncio.wait_for(batcher.enqueue([3], SamplingParams(max_tokens=1), True, 1), 10)

        assert asyncio.run(next_request()).token_ids == [1]
        assert errors == []
    finally:
        release.set()
        batcher.close()


def test_a_burst_is_generated_whole_however_slowly_its_rows_arrive(loop, session):
    """The loop's passes arrive tagged as one Burst: its rows run as one generate call even when they reach the server
    further apart than the batch window (and than MAX_WAIT_S in all), as a 64-row val pass did on a 2-core machine.
    The same rows untagged, as any other client sends them, are cut by the window."""
    from summrl.backends.embedded.server import MAX_WAIT_S
    from summrl.rollout import Burst

    backend, model, docs, _ = session
    gap = max(3 * backend.config.batch_window_ms / 1000, MAX_WAIT_S / 2)

    async def send(burst):
        async def one(i):
            await asyncio.sleep(gap * i)
            return await rollout(model, docs[i], prompt=FACTS, max_tokens=4, temperature=1.0, seed=i, burst=burst)
        return await asyncio.gather(*(one(i) for i in range(3)))

    before = len(backend._batcher.batch_sizes)
    loop.run_until_complete(send(Burst(id="pass-1", size=3)))
    assert backend._batcher.batch_sizes[before:] == [3]
    before = len(backend._batcher.batch_sizes)
    loop.run_until_complete(send(None))
    untagged = backend._batcher.batch_sizes[before:]
    assert sum(untagged) == 3 and len(untagged) > 1  # the first alone; the rest as they queued behind it


@pytest.mark.parametrize("early", [True, False])
def test_a_row_ends_at_its_own_max_tokens_and_is_answered_then_where_the_batcher_answers_early(loop, session, early):
    """Two requests in one generate call, asking 3 and 48 tokens: the short one gets 3 and, under summrl.serve
    (early=True), its answer while the long one still decodes (a 3-token chat waited 11.7 s behind a 400-token one).
    Training's batcher (early=False) answers a call's requests together, so what is batched next does not depend on
    when a row ended."""
    from summrl.backends.embedded.engine import SamplingParams
    from summrl.backends.embedded.server import Batcher

    backend = session[0]
    engine = backend._batcher.engine
    batcher = Batcher(engine, max_batch_size=8, window_s=0.1, early=early)
    prompt = engine.encode_chat([{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}])

    async def both():
        long = asyncio.ensure_future(batcher.enqueue(prompt, SamplingParams(max_tokens=48, temperature=1.0), True, 1))
        # and one that ends at its first space drawn (a stop sequence): answered then too
        spaced = batcher.enqueue(prompt, SamplingParams(max_tokens=48, temperature=1.0), True, 3, stops=(" ",))
        short = await batcher.enqueue(prompt, SamplingParams(max_tokens=3, temperature=1.0), True, 2)
        stopped = await spaced
        running = not long.done()
        return short, stopped, running, await long

    try:
        short, stopped, running, long = loop.run_until_complete(both())
    finally:
        batcher.close()
    assert batcher.batch_sizes == [3]  # one call
    assert (len(short.token_ids), short.finish_reason, len(short.logprobs)) == (3, "length", 3)
    assert " " in engine.decode(stopped.token_ids) and len(stopped.token_ids) < 12 and \
        " " not in engine.decode(stopped.token_ids[:-1])  # it ended with the token that drew the space
    assert running == early
    assert len(long.token_ids) > 3 and long.finish_reason in ("stop", "length") and len(long.token_ids) <= 48


def test_a_burst_missing_rows_runs_without_them_and_says_so(monkeypatch, caplog):
    """A burst whose last rows never come (their client failed) is generated once none has arrived for BURST_WAIT_S,
    with a warning that names it and how many arrived."""
    from summrl.backends.embedded import server
    from summrl.backends.embedded.engine import Completion, SamplingParams

    class Engine:  # the batcher's only contract with the engine: generate
        def generate(self, prompts, params, use_lora=True, seeds=None, rows=None):
            return [Completion([1], [0.0], "stop", len(p)) for p in prompts]

    monkeypatch.setattr(server, "BURST_WAIT_S", 0.3)
    batcher = server.Batcher(Engine(), max_batch_size=16, window_s=0.01)
    tag = server.Burst(id="val-0004", size=3)

    async def two_of_three():
        return await asyncio.gather(*(batcher.enqueue([i], SamplingParams(max_tokens=1), True, i, tag) for i in range(2)))

    try:
        started = time.monotonic()
        with caplog.at_level("WARNING", logger="summrl"):
            assert len(asyncio.run(two_of_three())) == 2
        assert time.monotonic() - started >= 0.3 and batcher.batch_sizes == [2]
        assert "burst val-0004: 2 of its 3 rows arrived" in caplog.text
    finally:
        batcher.close()


def test_untagged_requests_arriving_steadily_do_not_hold_an_incomplete_burst_back(monkeypatch):
    """The burst's wait restarted at every arrival: requests less than BURST_WAIT_S apart (a judge, a chat client) kept
    the batch open for ever, and nothing was generated (found by this stop's server audit)."""
    from summrl.backends.embedded import server
    from summrl.backends.embedded.engine import Completion, SamplingParams

    class Engine:
        def generate(self, prompts, params, use_lora=True, seeds=None, rows=None):
            return [Completion([1], [0.0], "stop", len(p)) for p in prompts]

    monkeypatch.setattr(server, "BURST_WAIT_S", 0.5)
    batcher = server.Batcher(Engine(), max_batch_size=64, window_s=0.01)

    async def burst_then_traffic():
        lone = asyncio.ensure_future(batcher.enqueue([1], SamplingParams(max_tokens=1), True, 1,
                                                     server.Burst(id="val", size=2)))  # its second row never comes
        started = time.monotonic()
        while not lone.done() and time.monotonic() - started < 5:
            asyncio.ensure_future(batcher.enqueue([2], SamplingParams(max_tokens=1), True, None))
            await asyncio.sleep(0.2)
        return lone.done(), time.monotonic() - started

    try:
        done, waited = asyncio.run(burst_then_traffic())
        assert done and waited < 2, waited
    finally:
        batcher.close()


def test_a_json_row_that_ends_early_does_not_fail_the_rows_batched_with_it(loop, session):
    """A grammar-constrained row that ended before the others (its own max_tokens) was padded with EOS, which
    xgrammar's processor fed to its matcher mid-JSON: its assert failed the call, and every request batched with it
    got a 500 (found by this stop's server audit)."""
    backend, model, _, _ = session
    client = model.openai_client()

    def ask(max_tokens: int, seed: int):
        return client.chat.completions.create(
            model=backend.model_config.base_model, messages=[{"role": "user", "content": "Name a color as JSON."}],
            max_tokens=max_tokens, seed=seed, response_format={"type": "json_object"})

    async def both():
        return await asyncio.gather(ask(2, 1), ask(24, 2))

    short, long = loop.run_until_complete(both())
    assert short.choices[0].finish_reason == "length" and len(long.choices[0].message.content) > 0
    alone = loop.run_until_complete(ask(24, 2))
    assert alone.choices[0].message.content == long.choices[0].message.content


def test_endpoint_checks_key_and_model_name(session):
    backend, model, _, _ = session
    url = f"{model.inference_base_url}/chat/completions"
    body = {"model": model.get_inference_name(), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(url, json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    unknown = httpx.post(url, json={**body, "model": "nope"}, headers={"Authorization": f"Bearer {model.inference_api_key}"})
    assert unknown.status_code == 404 and model.get_inference_name() in unknown.json()["error"]["message"]
    # a bad field is OpenAI's 400 with an error object, not FastAPI's 422 {"detail": [...]}, and n is bounded as
    # OpenAI bounds it (each choice is a row of the engine's batch)
    many = httpx.post(url, json={**body, "n": 129}, headers={"Authorization": f"Bearer {model.inference_api_key}"})
    assert many.status_code == 400, many.text
    assert many.json()["error"]["type"] == "invalid_request_error"
    assert many.json()["error"]["message"] == "bad request: n: Input should be less than or equal to 128"
    listed = httpx.get(f"{model.inference_base_url}/models", headers={"Authorization": f"Bearer {model.inference_api_key}"})
    assert model.get_inference_name() in {m["id"] for m in listed.json()["data"]}


def test_endpoint_reads_content_parts_and_null_content_as_text(session):
    """OpenAI's other forms of a message's text, which OpenAI's SDKs and vLLM take, were refused with 422: a list of
    text parts is read as its texts joined by newlines (vLLM's way), null as no text; an image part is refused."""
    backend, model, _, _ = session
    url = f"{model.inference_base_url}/chat/completions"
    headers = {"Authorization": f"Bearer {model.inference_api_key}"}

    def ask(*messages):
        body = {"model": model.get_inference_name(), "messages": list(messages), "max_tokens": 4, "seed": 3,
                "logprobs": True}
        return httpx.post(url, json=body, headers=headers, timeout=60)

    as_string = ask({"role": "user", "content": "Name a color.\nOne word."})
    as_parts = ask({"role": "user", "content": [{"type": "text", "text": "Name a color."},
                                                {"type": "text", "text": "One word."}]})
    assert as_string.status_code == as_parts.status_code == 200, as_parts.text
    assert as_parts.json()["choices"] == as_string.json()["choices"]  # the same prompt: the same tokens, logprobs
    with_null = ask({"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
                    {"role": "user", "content": "again"})
    assert with_null.status_code == 200, with_null.text
    image = ask({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]})
    assert image.status_code == 400 and "image_url" in image.text and "only text parts" in image.text


def test_the_choices_of_requests_with_neighbouring_seeds_are_not_shared(session):
    """The n choices were drawn with seed, seed+1, ...: a client asking again with the next seed (best-of-n through
    summrl.serve) got n - 1 of the same candidates back (an audit). The first choice keeps the seed itself."""
    backend, model, _, _ = session
    url = f"{model.inference_base_url}/chat/completions"
    headers = {"Authorization": f"Bearer {model.inference_api_key}"}

    def choices(seed: int, n: int) -> list[str]:
        body = {"model": model.get_inference_name(), "messages": [{"role": "user", "content": "Name three colors."}],
                "max_tokens": 8, "seed": seed, "n": n, "temperature": 1.0}
        reply = httpx.post(url, json=body, headers=headers, timeout=60)
        assert reply.status_code == 200, reply.text
        return [c["message"]["content"] for c in reply.json()["choices"]]

    first, second = choices(1, 3), choices(2, 3)
    assert not set(first) & set(second), (first, second)
    assert choices(1, 1) == first[:1] and choices(2, 1) == second[:1]


def test_packed_training_forward_reproduces_sampling_logprobs(loop, session):
    """The shared-prompt packing mask and completion-only logits give the sampler's own logprobs."""
    backend, model, docs, _ = session
    assert_training_forward_reproduces_sampling(loop, backend, model, docs[3])


def assert_training_forward_reproduces_sampling(loop, backend, model, doc) -> None:
    groups = loop.run_until_complete(art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout(model, doc, prompt=FACTS, max_tokens=MAX_TOKENS, temperature=1.0) for _ in range(3))],
        pbar_desc=None))
    for i, t in enumerate(groups[0].trajectories):
        t.reward = float(i)
    packed = backend._pack(groups)
    assert packed["tokens"].shape[0] == 1  # one group, one sequence: the prompt once, then 3 completions
    # on the engine's device, as train_packed moves them (CUDA where experiment=local's backend.device=auto finds one)
    inputs = {k: v[:1].to(backend.engine.device) for k, v in packed.items() if isinstance(v, torch.Tensor)}
    with torch.enable_grad():  # as training computes them: from the weights, never sampling's packed copies
        new = backend.engine.completion_logprobs(inputs).detach().cpu()
    old = torch.nn.functional.pad(packed["logprobs"][:1, 1:], (0, 1), value=float("nan"))
    mask = ~torch.isnan(old)
    assert mask.sum() >= 3
    assert torch.allclose(new[mask], old[mask], atol=2e-3)


def test_a_packed_sequence_length_a_group_does_not_fit_is_refused_not_an_update_of_nothing(loop, session):
    """ART leaves out a group longer than backend.packed_sequence_length (truncate_long_results=False): the step
    trained nothing (lora_B stayed 0, grad_norm 0) and was recorded as trained (found by an audit)."""
    from summrl.errors import ConfigError
    from summrl.rollout import check_packing

    backend, model, docs, _ = session
    groups = loop.run_until_complete(art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout(model, docs[3], prompt=FACTS, max_tokens=4, temperature=1.0) for _ in range(2))],
        pbar_desc=None))
    for i, t in enumerate(groups[0].trajectories):
        t.reward = float(i)
    setting = backend.config.packed_sequence_length
    try:
        backend.config.packed_sequence_length = 16
        with pytest.raises(ConfigError, match=r"^backend.packed_sequence_length=16: a group of this step packs into "
                                              r"\d+ tokens .* set it to \d+ or more, or null"):
            backend._pack(groups)
        backend.config.packed_sequence_length = 4096
        assert backend._pack(groups)["tokens"].shape == (1, 4096)  # one that fits: as set
        # checked once the model loads (loop.train), before any rollout is paid for: the longest prompt once, then
        # rollouts_per_group summaries of max_summary_tokens; a group of full-length summaries at that length packs
        worst = len(backend.engine.encode_chat(FACTS.messages(docs[3]))) + 2 * (4 + 1) - 1  # as ART packs it
        check_packing(backend.engine, [docs[3]], FACTS, 4, 2, worst)
        with pytest.raises(ConfigError, match=rf"^backend.packed_sequence_length={worst - 1}: a group can pack into "
                                              rf"{worst} tokens \(the longest prompt, document {docs[3].id}, .* set it "
                                              rf"to {-(-worst // 128) * 128} or more, or null"):
            check_packing(backend.engine, [docs[3]], FACTS, 4, 2, worst - 1)
        backend.config.packed_sequence_length = worst
        assert all(len(t.messages_and_choices[-1].logprobs.content) == 4 for t in groups[0].trajectories)
        assert backend._pack(groups)["tokens"].shape == (1, worst)
    finally:
        backend.config.packed_sequence_length = setting


def test_a_checkpoint_write_that_a_killed_process_left_is_removed_when_its_step_is_saved(tmp_path):
    """A process killed while it saved step 1 left .0001.tmp-<its pid> (an adapter and AdamW state: hundreds of MB
    at 3B); the resumed run, another pid, saved step 1 again beside it and nothing ever removed it."""
    import threading
    from types import SimpleNamespace

    from summrl.backends.embedded.engine import Engine

    def save_pretrained(path):
        Path(path).mkdir(parents=True)
        (Path(path) / "adapter_model.safetensors").write_bytes(b"weights")

    engine = SimpleNamespace(lock=threading.Lock(), model=SimpleNamespace(save_pretrained=save_pretrained),
                             optimizer=SimpleNamespace(state_dict=dict), trained_as=None)
    checkpoints = tmp_path / "checkpoints"
    left = checkpoints / ".0001.tmp-4194303"
    left.mkdir(parents=True)
    (left / "optimizer.pt").write_bytes(b"half written")
    other = checkpoints / ".0002.tmp-4194303"  # another step's: not this save's to judge
    other.mkdir()
    Engine.save_checkpoint(engine, checkpoints / "0001")
    assert sorted(p.name for p in checkpoints.iterdir()) == [".0002.tmp-4194303", "0001"]
    assert (checkpoints / "0001" / "adapter_model.safetensors").read_bytes() == b"weights"


def test_train_updates_lora_skips_flat_groups_and_checkpoints(loop, session):
    backend, model, docs, tmp = session
    groups = loop.run_until_complete(art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout(model, d, prompt=FACTS, max_tokens=MAX_TOKENS, temperature=1.0) for _ in range(4))
         for d in docs[:2]], pbar_desc=None))
    for i, t in enumerate(groups[0].trajectories):
        t.reward = [0.0, 1.0, 0.5, 0.25][i]
    for t in groups[1].trajectories:
        t.reward = 0.4  # no variance: no signal
    assert has_reward_variance(groups[0]) and not has_reward_variance(groups[1])
    # ART's rule, which its trainable count (data/step_num_groups_trainable) follows: rounding apart is apart
    from art.metrics_taxonomy import _group_is_trainable

    rounding = art.TrajectoryGroup([t.model_copy(update={"reward": r}) for t, r in
                                    zip(groups[0].trajectories, (0.1 + 0.2, 0.3, 0.3, 0.1 + 0.2))])
    assert has_reward_variance(rounding) and _group_is_trainable(rounding)
    step_before = loop.run_until_complete(model.get_step())
    before = backend.engine.lora_state()
    result = loop.run_until_complete(backend.train(model, groups, learning_rate=1e-3))
    after = backend.engine.lora_state()
    assert result.step == step_before + 1 == loop.run_until_complete(model.get_step())
    assert result.metrics["train/skipped_zero_variance_groups"] == 1.0
    assert any(not torch.equal(before[k], after[k]) for k in before)
    checkpoint = Path(model.base_path) / "summrl-tests" / "models" / model.name / "checkpoints" / f"{result.step:04d}"
    assert (checkpoint / "adapter_model.safetensors").exists() and (checkpoint / "optimizer.pt").exists()
    adapter_config = json.loads((checkpoint / "adapter_config.json").read_text())
    assert adapter_config["r"] == 16
    # sorted, not in the hash order of peft's set: the same adapter writes the same file in every process
    assert adapter_config["target_modules"] == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj",
                                                "v_proj"]
    # the endpoint now serves the new step, sampled from the trained weights (not the packed copies of the old ones)
    assert model.get_inference_name() == f"{model.name}@{result.step}"
    assert_training_forward_reproduces_sampling(loop, backend, model, docs[3])


# A fresh process (a test process's allocator already holds what earlier tests freed): SmolLM2 generates for a
# group's 8 rows of a 512-token prompt, then trains on one packed group (the prompt and 4 completions of 128 tokens);
# it prints its resident size after loading and after each phase.
MEMORY_PROBE = """
import json, sys, types, torch
from summrl.backends.embedded.engine import Engine, SamplingParams
from summrl.config import LoraConfig

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

engine = Engine(base_model=sys.argv[1], weights=sys.argv[2], lora=LoraConfig())
torch.manual_seed(0)
prompt, completion = 512, 128
tokens = torch.randint(100, 20000, (1, prompt + 4 * completion))
group = torch.cat([torch.zeros(prompt, dtype=torch.long)] + [torch.full((completion,), i) for i in range(1, 5)])[None]
packed = {
    "tokens": tokens, "group_ids": group, "parent_ids": torch.zeros_like(group),
    "input_pos": torch.cat([torch.arange(prompt)] + [torch.arange(prompt, prompt + completion)] * 4)[None],
    "assistant_mask": group > 0,
    "logprobs": torch.where(group > 0, -2.0, float("nan")), "advantages": (group.float() - 2.5) * (group > 0),
    "weights": torch.ones(group.shape),
}
sizes = [resident()]
engine.generate([tokens[0, :prompt].tolist()] * 8, SamplingParams(max_tokens=8), seeds=list(range(8)))
sizes.append(resident())
engine.train_packed(packed, types.SimpleNamespace(learning_rate=1e-6), {})
sizes.append(resident())
print(json.dumps(sizes))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads Linux's /proc")
def test_a_step_gives_back_what_it_frees():
    """Generation's KV caches and training's activations go back to the system when freed, not into glibc's arenas
    (engine.mmap_threshold). With glibc's own rising threshold they stayed there: this probe's resident size went from
    0.58 GB loaded to 3.6 GB, and experiment=local's grew 0.8 -> 6.5 -> 9.0 GB over its first two steps (12 GB by
    step 16). With the fixed thresholds it stays within 0.75 GB of the loaded model."""
    config = compose_config(["experiment=local"])
    probe = subprocess.run([sys.executable, "-c", MEMORY_PROBE, config.model.base_model, config.model.weights], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parent.parent)
    assert probe.returncode == 0, probe.stderr[-3000:]
    loaded, *after = json.loads(probe.stdout.splitlines()[-1])
    assert max(after) - loaded < 1.5e9, (loaded, after)


def test_a_new_backend_resumes_from_the_latest_checkpoint_and_releases_it_on_close(loop, session, tmp_path):
    backend, model, train, tmp = session
    saved = backend.engine.lora_state()
    _, backend2, model2 = make(tmp, name=model.name)
    try:
        loop.run_until_complete(model2.register(backend2))
        assert loop.run_until_complete(model2.get_step()) == loop.run_until_complete(model.get_step()) > 0
        restored = backend2.engine.lora_state()
        assert all(torch.equal(saved[k], restored[k]) for k in saved)
        assert backend2.engine.optimizer.state  # AdamW moments came back too
        engine = weakref.ref(backend2.engine)
        loop.run_until_complete(rollout(model2, train[0], prompt=SummaryPrompt("facts", 50), max_tokens=2, temperature=1.0))  # served
    finally:
        loop.run_until_complete(backend2.close())
    gc.collect()
    # A sweep runs its jobs one after another in one process: nothing (FastAPI's route cache included) may keep a
    # closed backend's weights alive.
    assert engine() is None


def test_json_schema_replies_are_grammar_constrained(loop, session):
    backend, model, _, _ = session
    schema = {"type": "object", "required": ["answers"], "additionalProperties": False,
              "properties": {"answers": {"type": "array", "items": {"type": "string", "maxLength": 20},
                                         "minItems": 3, "maxItems": 3}}}
    reply = loop.run_until_complete(model.openai_client().chat.completions.create(
        model=backend.model_config.base_model,  # the base model: no LoRA, as judge=embedded asks
        messages=[{"role": "user", "content": "Name three colors as JSON."}], max_tokens=80, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}},
    ))
    parsed = json.loads(reply.choices[0].message.content)
    assert list(parsed) == ["answers"] and len(parsed["answers"]) == 3
    assert all(isinstance(a, str) and len(a) <= 20 for a in parsed["answers"])  # the schema's string bound
    # A schema xgrammar can't compile is a 400 that says why, without xgrammar's "[time] file.cc:line:" location.
    with pytest.raises(openai.BadRequestError) as refused:
        loop.run_until_complete(model.openai_client().chat.completions.create(
            model=backend.model_config.base_model, messages=[{"role": "user", "content": "Hi."}], max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "objekt"}}}))
    assert refused.value.body["message"] == ("response_format: json_schema.schema can't be compiled to a grammar: "
                                            "Unsupported type \"objekt\"")


def test_embedded_judge_grades_a_group(loop, session):
    from summrl.judges import build_judge
    from summrl.judges.client import JudgeError

    backend, model, docs, tmp = session
    config = compose_config(["experiment=local", "judge=embedded", f"judge.cache_dir={tmp / 'grade-group-cache'}"])
    judge = build_judge(config.judge, (config.model.base_model, model.inference_base_url, model.inference_api_key))
    batches = len(backend._batcher.batch_sizes)
    results = loop.run_until_complete(judge.grade_group([docs[0].text[:400], "Nothing."], docs[0].questions))
    assert len(results) == 2
    for verdicts in results:
        assert not isinstance(verdicts, JudgeError), verdicts
        assert len(verdicts) == len(docs[0].questions) and all(isinstance(v, bool) for v in verdicts)
    # graded by the embedded model (not a fallback): its batcher ran, each summary was one call, and none was paid
    usage = judge.usage_metrics()
    assert len(backend._batcher.batch_sizes) > batches
    assert usage["judge/calls"] >= 2 and usage["judge/cached_calls"] == 0 and usage["judge/cost_usd"] == 0


def test_seeded_sampling_draws_each_token_from_the_models_distribution(session):
    """Seeded rows sample from softmax(logits / T), each from its own generator: the first tokens of 600 rows of one
    prompt, one seed each, fit the model's next-token distribution (chi-square); and a training group's rollouts,
    seeded sample_seed(seed, "train", step, document, i), are independent draws, not copies of one another."""
    from scipy import stats

    from summrl.backends.embedded.engine import SamplingParams
    from summrl.rollout import sample_seed

    backend, model, docs, _ = session
    engine = backend.engine
    prompt = engine.encode_chat([{"role": "user", "content": "Name one animal, in one word."}])
    temperature, rows = 0.7, 600
    with torch.no_grad(), engine.model.disable_adapter():
        logits = engine.model(input_ids=torch.tensor([prompt], device=engine.device)).logits[0, -1].float().cpu()
    expected = torch.softmax(logits / temperature, dim=-1)
    drawn = engine.generate([prompt] * rows, SamplingParams(max_tokens=1, temperature=temperature), use_lora=False,
                            seeds=list(range(rows)))
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in drawn]), minlength=len(expected)).float()
    top = torch.argsort(expected, descending=True)
    bins = top[: int((expected[top] * rows >= 5).sum())]  # tokens expected at least 5 times; the rest lumped
    observed = [*counts[bins].tolist(), rows - float(counts[bins].sum())]
    wanted = (expected[bins].double() * rows).tolist()
    wanted.append(rows - sum(wanted))
    assert len(bins) >= 3 and len(set(c.token_ids[0] for c in drawn)) >= 3
    assert stats.chisquare(observed, wanted).pvalue > 1e-3, (observed, wanted)
    greedy = [rows if i == 0 else 0 for i in range(len(wanted))]  # the test can tell: argmax decoding fails it
    assert stats.chisquare(greedy, wanted).pvalue < 1e-6

    seeds = [sample_seed(0, "train", 1, docs[0].id, i) for i in range(4)]
    # the base weights: what earlier tests trained (unseeded) made the adapter's distribution peaked enough that two
    # of four independent draws sometimes coincided
    group = engine.generate([engine.encode_chat([{"role": "user", "content": docs[0].text}])] * 4,
                            SamplingParams(max_tokens=32, temperature=1.0), use_lora=False, seeds=seeds)
    assert len({tuple(c.token_ids) for c in group}) == 4, [c.token_ids for c in group]  # copies would give 1


def test_the_local_judge_ranks_with_the_embedded_base_model_and_grades_qa_lexically(loop, session):
    """reward=ruler offline: RULER's judge is the embedded base model on the policy's own endpoint; val's QA accuracy is
    graded lexically (judge=local, experiment=local's); no key, no network. judge=embedded's RULER call is this same
    call, and its QA grading by SmolLM2 is test_embedded_judge_grades_a_group (a parametrized judge=embedded case, 29 s
    on 2 cores, did both again). (The training loop under reward=ruler runs end to end in test_train_e2e with
    judge=local, and with an LLM judge in conftest.shared_run.)"""
    from summrl.judges import build_judge
    from summrl.rewards import Missing, build_val_reward

    backend, model, docs, tmp = session
    config = compose_config(["experiment=local", "reward=ruler", "judge=local", f"judge.cache_dir={tmp / 'local-judge-cache'}"])
    assert config.judge.kind == "local"
    judge = build_judge(config.judge, (config.model.base_model, model.inference_base_url, model.inference_api_key))
    reward = build_val_reward(config, judge)
    document = docs[0]
    # the answers themselves, and nothing: every question answered, and only the unanswerable ones
    summaries = ["; ".join(q.answer for q in document.questions if q.answerable), "Nothing happened."]
    calls = len(backend._batcher.batch_sizes)
    engine, bound = backend.engine, backend.engine.max_string_chars
    engine.max_string_chars = 24  # backend.json_max_string_chars=24: short answers and RULER explanations, as in the e2e run
    try:
        scores = loop.run_until_complete(reward.score_group(document, summaries))
    finally:
        engine.max_string_chars = bound
    assert len(backend._batcher.batch_sizes) > calls  # RULER asked the embedded model
    assert not any(isinstance(s, Missing) for s in scores), scores
    for score in scores:
        assert 0.0 <= score.metrics["ruler_score"] <= 1.0 and 0.0 <= score.metrics["qa_accuracy"] <= 1.0
    usage = judge.usage_metrics()
    assert usage["judge/calls"] >= 1 and usage.get("judge/cost_usd", 0.0) == 0.0
    # graded lexically (a grader that graded nothing, or everything alike, passed the ">=" this was before)
    unanswerable = sum(not q.answerable for q in document.questions) / len(document.questions)
    assert 0.0 < unanswerable < 1.0
    assert [s.metrics["qa_accuracy"] for s in scores] == [1.0, pytest.approx(unanswerable)]


def test_a_gguf_is_dequantized_once_and_every_copy_of_it_loads_the_saved_weights(session, tmp_path):
    """The de-quantized copy is keyed by the GGUF's content: a copy of the file elsewhere (another venv, a fresh
    clone) loads the saved folder, not a second de-quantization, with the same weights; another dtype or a changed
    file gets its own entry."""
    import os
    import shutil

    import gguf
    import numpy as np

    from summrl.backends.embedded.engine import dequantized_cache, load_causal_lm
    from summrl.data import resolve_path

    gguf_path = resolve_path(compose_config(["experiment=local"]).model.weights)
    saved = dequantized_cache(gguf_path, torch.float32)
    assert (saved / "config.json").exists()  # the session's engine load wrote it
    copy = tmp_path / "elsewhere" / gguf_path.name
    copy.parent.mkdir()
    shutil.copyfile(gguf_path, copy)
    assert dequantized_cache(copy, torch.float32) == saved
    assert dequantized_cache(copy, torch.bfloat16) != saved
    entries = sorted(saved.parent.iterdir())
    written = os.stat(saved / "config.json").st_mtime_ns
    _, model = load_causal_lm("unused", str(copy), torch.float32, torch.device("cpu"))
    assert sorted(saved.parent.iterdir()) == entries and os.stat(saved / "config.json").st_mtime_ns == written
    # The loaded weights are the GGUF's: its token embeddings, de-quantized here by the gguf package itself.
    reader = gguf.GGUFReader(str(gguf_path))
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    expected = torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(embedding.data, embedding.tensor_type)))
    assert torch.equal(model.state_dict()["model.embed_tokens.weight"], expected.float())
    with copy.open("r+b") as f:  # one changed byte: a different file
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    assert dequantized_cache(copy, torch.float32) != saved


def test_the_data_tools_count_a_gguf_models_tokens_with_the_saved_copys_tokenizer(session):
    """Measuring documents (dataset.max_document_tokens, summrl.data inspect, summrl.serve's 413) reads a .gguf's
    tokenizer from the de-quantized copy the engine saved (0.5 s, not 8 to 18): it counts every sample document as
    the GGUF's own tokenizer does."""
    import json

    from summrl.backends.embedded.engine import dequantized_cache, gguf_tokenizer
    from summrl.data import resolve_path
    from summrl.data.tokenizer import load_tokenizer

    model = compose_config(["experiment=local"]).model
    gguf_path = resolve_path(model.weights)
    saved = dequantized_cache(gguf_path, torch.float32)
    assert (saved / "config.json").exists()  # the session's engine load wrote it
    tokenizer = load_tokenizer(model)
    assert tokenizer.name_or_path == str(saved)
    own = gguf_tokenizer(gguf_path)
    texts = sorted({json.loads(line)["document_extracted"] for line in SAMPLE.read_text().splitlines()})
    for text in texts:
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == own(text, add_special_tokens=False)["input_ids"]


def test_decoder_layers_keep_less_for_the_backward_pass_and_give_the_same_gradients():
    """activations.install: under keeping_less(), the norms' outputs, silu(gate) and silu(gate) * up are kept as ways
    to remake them, so a LoRA model's training forward keeps less per token and layer, and its gradients do not move
    (the same bits)."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from summrl.backends.embedded import activations

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, target_modules=["q_proj", "gate_proj", "up_proj", "down_proj"],
                                                                 init_lora_weights=False))
    ids = torch.randint(0, 97, (1, 40))
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def backward() -> tuple[int, list[torch.Tensor]]:
        kept: dict[int, int] = {}

        def observe(t: torch.Tensor) -> None:
            if t.untyped_storage().data_ptr() not in weights:
                kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()

        model.zero_grad(set_to_none=True)
        with activations.keeping_less(observe):
            loss = model(input_ids=ids).logits.logsumexp(-1).sum()
        loss.backward()
        return sum(kept.values()), [p.grad.clone() for p in model.parameters() if p.requires_grad]

    plain_bytes, plain_grads = backward()
    assert activations.install(model) == 2
    less_bytes, less_grads = backward()
    assert all(torch.equal(a, b) for a, b in zip(plain_grads, less_grads))
    # in each of the 2 layers: two [40, 96] float32 activations less (the MLP), and the two norms' [40, 32] outputs
    assert plain_bytes - less_bytes >= 2 * (2 * 40 * 96 + 2 * 40 * 32) * 4, (plain_bytes, less_bytes)


def test_rows_that_share_a_prompt_attend_to_one_copy_of_it_as_if_each_had_its_own():
    """attention.SharedPrefix: a prompt's keys and values are stored once for all the rows sampled from it, and each row's
    attention over (its prompt, its own tokens) equals attention over its own full cache, as before. Uneven rows per
    prompt, rows out of prompt order, a left-padded prompt and a prompt with nothing before its last token."""
    from summrl.backends.embedded.attention import SharedPrefix, _decode_attention, _shared_prefix_attention

    torch.manual_seed(0)
    kv_heads, group, dim, width, own = 2, 3, 8, 6, 4
    lengths = [6, 3, 1]  # prompt tokens; all but the last are the shared prefix, left-padded to width - 1
    row_of = [0, 1, 0, 2, 0, 1]
    rows, prompts = len(row_of), len(lengths)
    prompt_keys, prompt_values = (torch.randn(prompts, kv_heads, width - 1, dim) for _ in range(2))
    mask = torch.tensor([[i >= width - n for i in range(width - 1)] for n in lengths])
    prompt_keys[~mask[:, None, :, None].expand_as(prompt_keys)] = 0.0  # padding is zeros, as _prefill leaves it
    own_keys, own_values = (torch.randn(rows, kv_heads, own, dim) for _ in range(2))
    query = torch.randn(rows, kv_heads * group, 1, dim)
    slot, per_prompt = SharedPrefix.layout(row_of, prompts)
    assert per_prompt == 3 and sorted(slot.tolist()) == sorted(set(slot.tolist()))
    prefix = SharedPrefix([prompt_keys], [prompt_values], mask[:, None, None, :], slot, per_prompt)
    shared = _shared_prefix_attention(query, own_keys, own_values, prefix, 0, None)

    for row, prompt in enumerate(row_of):  # the reference: the row's own copy of its prompt, unpadded
        keep = mask[prompt]
        keys = torch.cat([prompt_keys[prompt][:, keep], own_keys[row]], dim=1)[None]
        values = torch.cat([prompt_values[prompt][:, keep], own_values[row]], dim=1)[None]
        alone = _decode_attention(query[row:row + 1], keys, values, None, None)
        torch.testing.assert_close(shared[row:row + 1], alone, rtol=1e-5, atol=1e-6)


def test_requests_that_keep_arriving_join_one_batch():
    """The batcher's window restarts at each arrival: requests posted 40 ms apart with a 100 ms window are one
    generate call (counted from the first request, the window split them), and a lone request is not held back until
    MAX_WAIT_S. The gaps leave room for a loaded machine's timer jitter."""
    from summrl.backends.embedded.engine import Completion, SamplingParams
    from summrl.backends.embedded.server import MAX_WAIT_S, Batcher

    class Engine:  # the batcher's only contract with the engine: generate
        def generate(self, prompts, params, use_lora=True, seeds=None, rows=None):
            return [Completion([1], [0.0], "stop", len(p)) for p in prompts]

    batcher = Batcher(Engine(), max_batch_size=16, window_s=0.1)

    async def post(delay: float, prompt: list[int]) -> float:
        await asyncio.sleep(delay)
        start = time.monotonic()
        await batcher.enqueue(prompt, SamplingParams(max_tokens=1), use_lora=True)
        return time.monotonic() - start

    async def arrivals() -> list[float]:
        return await asyncio.gather(*(post(0.04 * i, [i]) for i in range(6)))

    try:
        asyncio.run(arrivals())
        assert batcher.batch_sizes == [6]
        alone = asyncio.run(post(0.0, [9]))
        assert batcher.batch_sizes == [6, 1] and alone < 0.8 * MAX_WAIT_S
    finally:
        batcher.close()
