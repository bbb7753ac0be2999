"""One declaration of each option (fastnsq.optionspec) and what is read from it (issue 47).

The TypedDicts and docs/options.md are written from the table (a stale one fails here), the
dataclass and the recovery rule agree with it, the run-time checks come from it, and an
unknown option is refused with the name to use where it is pynsq's or go-nsq's.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest

import fastnsq.sync
from fastnsq import ConnectionOptions, Consumer, InvalidValueError, Producer
from fastnsq import typed_options as typed
from fastnsq.backoff import BackoffPolicy
from fastnsq.optionfiles import main as optionfiles_main
from fastnsq.optionfiles import written_files
from fastnsq.options import parse_options
from fastnsq.optionspec import OPTIONS, SYNC_PRODUCER_PARAMETERS, check_options, options_of
from fastnsq.recovery import RETRY_DELAY

NSQD = ["127.0.0.1:4150"]


def test_the_written_files_match_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    stale = [path.name for path, text in written_files().items() if path.read_text() != text]
    assert stale == [], "run: python -m fastnsq.optionfiles --write"
    assert optionfiles_main(["--check"]) == 0


def test_the_check_finds_a_stale_file(tmp_path: typing.Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """--check is not a check that cannot fail: a file that differs is reported."""
    path, text = next(iter(written_files().items()))
    copy = tmp_path / path.name
    copy.write_text(text + "# edited by hand\n")
    monkeypatch.setattr("fastnsq.optionfiles.written_files", lambda: {copy: text})
    assert optionfiles_main(["--check"]) == 1


def typed_keys(typed_dict: typing.Any) -> set[str]:
    return set(typed_dict.__annotations__)


@pytest.mark.parametrize("client, typed_dict", [("Consumer", typed.ConsumerOptions),
                                                ("Producer", typed.ProducerOptions)])
def test_each_client_takes_exactly_the_keys_of_its_typed_dict(client: str, typed_dict: typing.Any) -> None:
    assert typed_keys(typed_dict) == set(options_of(client))


def test_the_blocking_producer_declares_its_own_parameters_apart() -> None:
    assert typed_keys(typed.ProducerOptions) - typed_keys(typed.SyncProducerOptions) == set(SYNC_PRODUCER_PARAMETERS)


def test_the_table_and_the_connection_dataclass_agree() -> None:
    fields = {field.name: field for field in dataclasses.fields(ConnectionOptions)}
    connection = {option.name: option for option in OPTIONS if option.client == "connection"}
    assert set(fields) == set(connection)
    hints = typing.get_type_hints(ConnectionOptions)
    for name, field in fields.items():
        option = connection[name]
        if option.default_doc and option.default is None and field.default is not None:
            continue  # computed (the host name, the version): the table says it in words
        assert option.default == field.default, name
        takes_none = type(None) in typing.get_args(hints[name])
        assert takes_none == ("None" in option.annotation), name


def test_the_defaults_are_the_clients_and_the_recovery_rules() -> None:
    assert options_of("Consumer")["reconnect_delay"].default == RETRY_DELAY
    assert options_of("Producer")["max_reconnect_delay"].default == RETRY_DELAY
    consumer = Consumer("t", "c", nsqd_tcp_addresses=NSQD)
    for name in ("max_attempts", "default_requeue_delay", "lookupd_poll_interval", "connections_per_nsqd"):
        assert getattr(consumer, name) == options_of("Consumer")[name].default
    assert consumer.max_in_flight == options_of("Consumer")["max_in_flight"].default


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.pynsq and o.pynsq != (o.name,)], ids=lambda o: o.name)
def test_pynsqs_names_are_refused_with_the_name_to_use(option: typing.Any) -> None:
    client = "Producer" if option.client == "producer" else "Consumer"
    for name in option.pynsq:
        if name == option.name:
            continue
        with pytest.raises(InvalidValueError) as caught:
            check_options(client, {name: 1})
        assert str(caught.value) == f"unknown {client} option {name}: pynsq's name; fastnsq calls it {option.name}"


@pytest.mark.parametrize("given, hint", [
    ({"max_tries": 3}, "max_tries: pynsq's name; fastnsq calls it max_attempts"),
    ({"message_handler": print}, "message_handler: pynsq's name; fastnsq calls it handler (an argument of Consumer)"),
    ({"tls_config": None}, "tls_config: go-nsq's name; fastnsq calls it tls_context"),
    ({"MaxInFlight": 3}, "MaxInFlight: go-nsq's Config field; fastnsq calls it max_in_flight"),
    ({"pool_size": 2}, "pool_size: a Producer option, not a Consumer one"),
    ({"max_in_flite": 2}, "max_in_flite: no such option (did you mean max_in_flight?)"),
])
def test_an_unknown_consumer_option_names_what_to_use(given: dict[str, typing.Any], hint: str) -> None:
    with pytest.raises(InvalidValueError, match="unknown Consumer option") as caught:
        Consumer("t", "c", nsqd_tcp_addresses=NSQD, **given)
    assert str(caught.value).endswith(hint), caught.value


def test_unknown_options_are_all_named_at_once() -> None:
    with pytest.raises(InvalidValueError) as caught:
        Producer(NSQD, reconnect_interval=15, max_in_flight=1)
    assert str(caught.value) == ("unknown Producer options: reconnect_interval: pynsq's name; fastnsq calls it "
                                 "reconnect_delay | max_in_flight: a Consumer option, not a Producer one")


@pytest.mark.parametrize("given, error", [
    ({"max_in_flight": "10"}, "max_in_flight must be an int, got '10'"),
    ({"msg_timeout": "30s"}, "msg_timeout must be seconds (a number), got '30s'"),
    ({"auto_touch": "false"}, "auto_touch must be True or False, got 'false'"),
    ({"backoff_strategy": "pynsq"}, ("backoff_strategy must be one of ('exponential', 'full_jitter', 'linear') "
                                     "or a callable, got 'pynsq'")),
    ({"max_attempts": 70000}, "max_attempts=70000 is outside the accepted range 0..65535"),
])
def test_run_time_checks_stay_for_untyped_callers(given: dict[str, typing.Any], error: str) -> None:
    with pytest.raises(InvalidValueError) as caught:
        fastnsq.sync.Consumer("t", "c", nsqd_tcp_addresses=NSQD, **given)
    assert str(caught.value) == error


def test_strings_take_go_durations_and_refuse_objects_with_the_name_to_use() -> None:
    assert parse_options(["backoff_strategy=linear", "backoff_multiplier=20ms", "lookupd_poll_jitter=0.5",
                          "partition=3"], for_="consumer") == {
        "backoff_strategy": "linear", "backoff_multiplier": 0.02, "lookupd_poll_jitter": 0.5, "partition": 3}
    with pytest.raises(InvalidValueError, match="takes a Python object"):
        parse_options(["give_up_handler=print"], for_="consumer")
    with pytest.raises(InvalidValueError, match="max_tries: pynsq's name; fastnsq calls it max_attempts"):
        parse_options(["max_tries=3"], for_="consumer")


def test_the_linear_strategy_steps_by_the_multiplier() -> None:
    policy = BackoffPolicy("linear", max_backoff_duration=0.05, multiplier=0.02)
    assert [policy.duration(level) for level in (1, 2, 3)] == [0.02, 0.04, 0.05]
    assert policy.can_deepen(2) and not policy.can_deepen(3)


def test_the_clients_docstrings_list_every_option_with_its_default() -> None:
    for client in (Consumer, Producer):
        for name, option in options_of(client.__name__).items():
            assert f"``{name}`` ({option.shown_default}" in (client.__doc__ or ""), name
