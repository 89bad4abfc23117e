"""Constrained decoding in the one decode loop: the single stream and every engine slot sample inside the grammar,
sampled or greedy, speculating or not, preempted or not; a grammar that does not compile is refused before
anything is queued. Real models: SmolLM2-135M and Gemma 3 270M; every answer is validated with ``jsonschema``."""

from __future__ import annotations

import json

import jsonschema
import pytest

from runtime.errors import BadInput
from runtime.llm.grammar import JSON_OBJECT, Grammar
from runtime.llm.json_schema import schema_grammar
from runtime.llm.model import LLM
from runtime.serving.engine import Engine
from runtime.serving.engine_requests import GenRequest
from runtime.serving.scheduler import Priority

GiB = 1 << 30
LIGHT = {
    "type": "object",
    "properties": {
        "name": {"enum": ["kitchen", "hall", "bedroom lamp"]},
        "on": {"type": "boolean"},
        "brightness": {"type": "integer", "minimum": 0, "maximum": 100},
        "color": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}, "minItems": 3, "maxItems": 3},
        "note": {"type": "string", "maxLength": 12},
        "temp": {"type": "number", "minimum": -2.5, "exclusiveMaximum": 30},
    },
    "required": ["name", "on"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Turn the kitchen light on at half brightness, warm white. Answer in JSON."}]
PLAIN = "The kitchen light, on at half brightness and warm white, as a JSON object:\n"


@pytest.fixture(scope="module")
def llms(smollm, gemma):
    with LLM.load(smollm, ctx=1024, threads=2) as smol, LLM.load(gemma, ctx=1024, threads=2) as gem:
        yield {"smollm": smol, "gemma": gem}


@pytest.mark.parametrize("family", ["smollm", "gemma"])
def test_sampled_answers_always_validate(llms, family: str) -> None:
    llm = llms[family]
    grammar = schema_grammar(LIGHT)
    for seed in range(6):  # Gemma 3 270M is a base model: both continue a plain prompt (more: test_grammar_validity)
        result = llm.generate(PLAIN, llm.params(temperature=1.0, seed=seed, max_tokens=160, grammar=grammar))
        assert result.stop_reason == "eos", (seed, result.text)
        jsonschema.validate(json.loads(result.text), LIGHT)


def test_json_object_mode_gives_an_object(llms) -> None:
    llm = llms["smollm"]
    for seed in range(4):
        result = llm.chat(ASK, llm.params(temperature=0.8, seed=seed, max_tokens=500, grammar=JSON_OBJECT)).finish()
        assert result.stop_reason == "eos", result.text
        assert isinstance(json.loads(result.text), dict)


def test_chat_takes_a_schema_in_python(llms) -> None:
    llm = llms["smollm"]
    result = llm.chat(ASK, llm.params(temperature=0.0, max_tokens=160), schema=LIGHT).finish()
    jsonschema.validate(json.loads(result.text), LIGHT)
    with pytest.raises(BadInput, match=r"^schema\.properties\.x\.pattern"):
        llm.chat(ASK, schema={"type": "object", "properties": {"x": {"type": "string", "pattern": "a"}}})


@pytest.mark.parametrize("family", ["smollm", "gemma"])
def test_greedy_after_a_rejection_picks_what_the_full_grammar_pass_picks(llms, family: str, monkeypatch) -> None:
    """The greedy fast path (the best admitted token among the top few, checked one by one) against llama.cpp's
    full pass over the vocabulary: the same answers, token for token."""
    from runtime.backends import llamacpp

    llm = llms[family]
    schemas = [LIGHT, {"type": "array", "items": {"type": "integer", "minimum": 100, "maximum": 999}, "maxItems": 6}]
    params = [llm.params(temperature=0.0, max_tokens=160, grammar=schema_grammar(s)) for s in schemas]
    fast = [llm.generate(PLAIN, p).text for p in params]
    monkeypatch.setattr(llamacpp.GrammarChain, "_best_admitted", lambda self, cur: None)
    assert [llm.generate(PLAIN, p).text for p in params] == fast


def test_greedy_output_is_the_same_with_speculation_on_and_off(llms) -> None:
    llm = llms["smollm"]
    params = llm.params(temperature=0.0, max_tokens=120, grammar=schema_grammar(LIGHT))
    prompt = llm.fit_chat(ASK, params)
    spec = llm.start(prompt.tokens, params, n_keep=prompt.n_keep).finish()
    plain = llm.start(prompt.tokens, params, n_keep=prompt.n_keep, speculate=False).finish()
    assert spec.text == plain.text
    jsonschema.validate(json.loads(spec.text), LIGHT)


def test_a_grammar_that_does_not_compile_is_refused_before_decoding(llms) -> None:
    llm = llms["smollm"]
    for text in ('root ::= undefined-rule', 'root ::= root "a"', 'expr ::= "a"', 'root ::= ["a'):
        with pytest.raises(BadInput, match="does not compile as GBNF"):
            llm.generate("Hello", llm.params(max_tokens=4, grammar=Grammar(text, "grammar")))
    assert llm.generate("Hello", llm.params(max_tokens=4)).text is not None  # the model is fine afterwards


@pytest.fixture(scope="module")
def engine(smollm):
    with Engine.load(smollm, memory=GiB, slots=4, ctx=1024, threads=2) as eng:
        yield eng


def test_every_slot_keeps_its_own_grammar(engine) -> None:
    # four requests at once, each with another schema (or none): each answer is valid for its own
    schemas = [LIGHT, {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 4},
               {"type": "integer", "minimum": 10, "maximum": 20}, None]
    prompt, _ = engine.chat_prompt(ASK)
    handles = [engine.submit(GenRequest(prompt, engine.params(
        temperature=1.0, seed=seed, max_tokens=160, grammar=schema_grammar(s) if s else None)))
        for seed, s in enumerate(schemas)]
    results = [h.result(timeout=120) for h in handles]
    for schema, result in zip(schemas[:3], results[:3], strict=True):
        assert result.stop_reason == "eos", result.text
        jsonschema.validate(json.loads(result.text), schema)


def test_a_preempted_sequence_keeps_its_grammar_and_its_answer(smollm) -> None:
    # the same greedy request alone, and preempted by an urgent one partway: the same valid answer
    with Engine.load(smollm, memory=GiB, slots=1, ctx=1024, threads=2, start=False) as eng:
        prompt, _ = eng.chat_prompt(ASK)
        params = eng.params(temperature=0.0, max_tokens=120, grammar=schema_grammar(LIGHT))
        alone = eng.submit(GenRequest(prompt, params, priority=Priority.BATCH))
        while eng.step():
            pass
        first = alone.result(timeout=60)
        batch = eng.submit(GenRequest(prompt, params, priority=Priority.BATCH))
        for _ in range(12):
            eng.step()
        urgent = eng.submit(GenRequest(eng.tokenize("Hi"), eng.params(max_tokens=4), priority=Priority.URGENT))
        while eng.step():
            pass
        assert urgent.result(timeout=60).text is not None
        second = batch.result(timeout=60)
        assert second.preemptions >= 1 and second.text == first.text
        jsonschema.validate(json.loads(second.text), LIGHT)


def test_the_engine_refuses_a_grammar_that_does_not_compile_at_submit(engine) -> None:
    with pytest.raises(BadInput, match="does not compile as GBNF"):
        engine.submit(GenRequest(engine.tokenize("Hi"), engine.params(grammar=Grammar('root ::= nothing', "grammar"))))


def test_the_cli_answers_inside_a_json_schema_file(smollm, tmp_path, capsys) -> None:
    from apps.cli import main as cli

    schema = tmp_path / "light.json"
    schema.write_text(json.dumps(LIGHT))
    code = cli(["run", "default", "--chat", "--prompt", ASK[0]["content"], "--json-schema", str(schema),
                "--max-tokens", "160", "--temperature", "0", "--memory", "1G", "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    jsonschema.validate(json.loads(json.loads(out)["text"]), LIGHT)


@pytest.mark.parametrize("content, flag, words", [
    ('{"type": "string", "pattern": "^a$"}', "--json-schema", "s.json.pattern: is not a keyword this server can enforce"),
    ("{not json", "--json-schema", "s.json: not JSON"),
    ('root ::= nothing', "--grammar", "--grammar "),
])
def test_the_cli_refuses_a_bad_schema_or_grammar_in_one_line(smollm, tmp_path, capsys, content: str, flag: str,
                                                             words: str) -> None:
    from apps.cli import main as cli

    path = tmp_path / "s.json"
    path.write_text(content)
    code = cli(["run", "default", "--prompt", "Hi", flag, str(path), "--max-tokens", "4", "--memory", "1G"])
    err = capsys.readouterr().err
    assert code == 2 and words in err and err.count("\n") == 1, err


def test_an_abandoned_grammar_sampler_is_freed(llms, monkeypatch) -> None:
    # a caller that stops iterating never reaches Decoding.close(): the grammar's native sampler goes with the object
    import gc

    import llama_cpp

    freed = []
    real = llama_cpp.llama_sampler_free
    monkeypatch.setattr(llama_cpp, "llama_sampler_free", lambda s: (freed.append(s), real(s)))
    llm = llms["smollm"]
    gen = llm.stream(PLAIN, llm.params(max_tokens=40, grammar=schema_grammar(LIGHT)))
    next(iter(gen))
    grammar = gen.seq.sampler.grammar
    assert grammar and grammar not in freed
    del gen
    gc.collect()
    assert grammar in freed
