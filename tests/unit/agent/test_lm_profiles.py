"""Profiles are validated on write with errors that name the field, the value and the fix,
and they can never carry a key."""

import msgspec
import pytest

from fleet_events.llm import (
    InvalidProfile,
    LlmProfile,
    Prices,
    check_profile,
    check_role,
    cost,
    decode_profile,
    encode_profile,
    profile_key,
    role_key,
)

PLANTED = "sk-planted-0123456789abcdef"


def profile(**fields: object) -> LlmProfile:
    return LlmProfile(**{"name": "local", "model": "openai/qwen", **fields})  # type: ignore[arg-type]


def test_a_good_profile_round_trips() -> None:
    good = profile(
        api_base="http://127.0.0.1:8080/v1",
        secret="local-key",
        timeout_s=30,
        max_tokens=512,
        prices=Prices(input_per_mtok=0.5, output_per_mtok=1.5),
    )
    assert decode_profile(encode_profile(good)) == good


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": "has space"}, "field 'model' cannot be 'has space': give a LiteLLM model"),
        ({"model": ""}, "field 'model' cannot be ''"),
        ({"name": "a.b"}, "invalid profile id 'a.b'"),
        ({"secret": "x y"}, "invalid secret id 'x y'.*never holds a key"),
        ({"timeout_s": 0.0}, "'timeout_s' cannot be 0.0: use seconds above 0"),
        ({"timeout_s": float("nan")}, "'timeout_s' cannot be nan"),
        ({"max_tokens": 0}, "'max_tokens' cannot be 0: use 1 to"),
        ({"temperature": 3.0}, "'temperature' cannot be 3.0: use 0 to 2"),
        ({"prices": Prices(input_per_mtok=-1)}, r"'prices.input_per_mtok' cannot be -1"),
        ({"prices": Prices(output_per_mtok=float("inf"))}, "'prices.output_per_mtok'"),
        ({"api_base": "ftp://host/v1"}, "'api_base' cannot be 'ftp://host/v1': give an http"),
    ],
)
def test_bad_fields_are_named_with_the_fix(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidProfile, match=message):
        check_profile(profile(**fields))


@pytest.mark.parametrize(
    "api_base",
    [
        f"https://user:{PLANTED}@llm.example/v1",
        f"https://llm.example/v1?api_key={PLANTED}",
        f"https://llm.example/v1#{PLANTED}",
    ],
)
def test_an_address_carrying_a_credential_is_refused_without_echoing_it(api_base: str) -> None:
    with pytest.raises(InvalidProfile, match="must not carry credentials") as caught:
        check_profile(profile(api_base=api_base))
    assert PLANTED not in str(caught.value)


@pytest.mark.parametrize("field", ["api_key", "key", "token", "password"])
def test_a_profile_holding_a_key_is_refused_and_the_key_is_not_echoed(field: str) -> None:
    raw = msgspec.json.encode({"name": "p", "model": "openai/x", field: PLANTED})
    refused = f"'{field}' is refused: a profile holds a secret"
    with pytest.raises(InvalidProfile, match=refused) as e:
        decode_profile(raw)
    assert PLANTED not in str(e.value)


def test_unknown_fields_and_wrong_types_are_refused() -> None:
    with pytest.raises(InvalidProfile, match="malformed profile: Object contains unknown field"):
        decode_profile(b'{"name": "p", "model": "openai/x", "colour": "red"}')
    with pytest.raises(InvalidProfile, match="malformed profile: Expected `float`"):
        decode_profile(b'{"name": "p", "model": "openai/x", "timeout_s": "soon"}')
    with pytest.raises(InvalidProfile, match="a profile must be a JSON object"):
        decode_profile(b"{not json")


def test_roles_and_keys() -> None:
    assert check_role("delegate_small") == "delegate_small"
    with pytest.raises(InvalidProfile, match="unknown LLM role 'boss': roles are planner"):
        check_role("boss")
    assert profile_key("default") == "global.llm.profile.default"
    assert profile_key("default", "acme") == "tenant.acme.llm.profile.default"
    assert role_key("planner", "acme") == "tenant.acme.llm.role.planner"
    with pytest.raises(ValueError, match="invalid tenant id"):
        role_key("planner", "a.*")


def test_cost_is_priced_per_million_tokens() -> None:
    prices = Prices(input_per_mtok=2.0, output_per_mtok=10.0)
    assert cost(prices, 1_000_000, 0) == pytest.approx(2.0)
    assert cost(prices, 500, 100) == pytest.approx((500 * 2 + 100 * 10) / 1e6)
    assert cost(Prices(), 10**9, 10**9) == 0.0
