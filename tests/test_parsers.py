"""Parsers and answer-extraction helpers."""

import pytest

import envs as vf


def test_extract_boxed_answer_nested_and_strict():
    assert vf.extract_boxed_answer("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert vf.extract_boxed_answer("a \\boxed{1} then \\boxed{2}") == "2"
    assert vf.extract_boxed_answer("no box") == "no box"
    assert vf.extract_boxed_answer("no box", strict=True) == ""
    assert vf.extract_boxed_answer("\\boxed{unclosed", strict=True) == ""


def test_extract_hash_answer():
    assert vf.extract_hash_answer("steps...\n#### 42 ") == "42"
    assert vf.extract_hash_answer("no marker") is None


def test_ensure_keys(monkeypatch):
    monkeypatch.setenv("VF_T_A", "1")
    monkeypatch.delenv("VF_T_B", raising=False)
    monkeypatch.delenv("VF_T_C", raising=False)
    vf.ensure_keys(["VF_T_A"])
    with pytest.raises(vf.MissingKeyError) as ei:
        vf.ensure_keys(["VF_T_A", "VF_T_B", "VF_T_C"])
    assert ei.value.keys == ["VF_T_B", "VF_T_C"]
    assert "VF_T_B" in str(ei.value) and isinstance(ei.value, ValueError)


def test_parser_parse_answer_uses_last_assistant():
    p = vf.Parser(extract_fn=vf.extract_boxed_answer)
    completion = [
        {"role": "assistant", "content": "\\boxed{1}"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "final \\boxed{7}"},
    ]
    assert p.parse_answer(completion) == "7"
    assert p.parse_answer("plain \\boxed{3}") == "3"
    assert p.parse_answer([{"role": "user", "content": "x"}]) is None


def test_xml_parser_fields_alternatives_and_format():
    p = vf.XMLParser(fields=["reasoning", ("code", "answer")])
    parsed = p.parse("<reasoning>think</reasoning>\n<answer> 42 </answer>")
    assert parsed.reasoning == "think" and parsed.answer == "42" and parsed.code is None
    assert p.get_fields() == ["reasoning", "code"]
    assert p.parse_answer([{"role": "assistant", "content": "<answer>5</answer>"}]) == "5"
    assert p.get_format_str() == "<reasoning>\n...\n</reasoning>\n<[ code | answer ]>\n...\n</[ code | answer ]>"
    # the reference: canonical tags in format(), every field required
    assert p.format(reasoning="r", answer="a") == "<reasoning>\nr\n</reasoning>\n<code>\na\n</code>"
    with pytest.raises(ValueError, match="code"):
        p.format(reasoning="r")
    # a field needs its closing tag; the first occurrence per message, the last in a string
    assert p.parse("<answer>unclosed").answer is None
    assert p.parse_answer("<answer>1</answer><answer>2</answer>") == "2"
    assert p.parse_answer([{"role": "assistant", "content": "<answer>1</answer>"},
                           {"role": "assistant", "content": "no tags"}]) == "1"
    fmt = p.get_format_reward_func()
    assert fmt([{"role": "assistant", "content": "<reasoning>x</reasoning><answer>y</answer>"}]) == 1.0
    # 0.4 * 1/2 field sets + 0.2 spacing + 0.2 starts with the first set (does not end with the last)
    assert fmt([{"role": "assistant", "content": "<reasoning>x</reasoning>"}]) == pytest.approx(0.6)
    assert fmt([{"role": "assistant", "content": "nothing"}]) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        vf.XMLParser(fields=["a", "a"])


def test_think_parsers():
    tp = vf.ThinkParser(extract_fn=vf.extract_boxed_answer)
    assert tp.parse("<think>hmm</think> so \\boxed{4}") == "4"
    assert tp.parse("<think>never closed") == ""
    assert tp.parse("no think at all \\boxed{4}") == ""  # the reference: empty without </think>
    assert tp.parse_answer([{"role": "assistant", "content": "4"}]) == ""
    fmt = tp.get_format_reward_func()
    assert fmt([{"role": "assistant", "content": "<think>a</think>b"}]) == 1.0
    assert fmt([{"role": "assistant", "content": "b"}]) == 0.0
    mp = vf.MaybeThinkParser()
    assert mp.parse("<think>x</think> answer") == "answer"
    assert mp.parse("answer") == "answer"
