"""``fastnsq to-nsq``: nsq_to_nsq's command line, on fastnsq (:mod:`fastnsq.apps.to_nsq`)."""

from __future__ import annotations

import argparse
from typing import Any

from ._apps import add_app_parser, add_consume_flags, require_servers, run_app_from
from ._common import UsageError, http_address_arg, nsqd_address_arg, passthrough_options, topic_arg

_EPILOG = """\
Flags as nsq_to_nsq's (one dash or two: -topic=events works). Each batch goes out as one MPUB;
its messages are FINed when the destination nsqd answers OK, requeued when it fails. Beyond
nsq_to_nsq: --destination-lookupd-http-address, --metrics-port, --drain-timeout, and youzan's
partitioned (HA) topics on either side: --sharding-key-json-field, ext headers and trace ids
carried from an HA topic to an HA topic. docs/apps.md maps every nsq_to_nsq flag.
"""


def _build_to_nsq(commands: Any, common: argparse.ArgumentParser, client: argparse.ArgumentParser) -> None:
    sub = add_app_parser(commands, [common, client], "to-nsq", help="relay topics to other nsqd (nsq_to_nsq)",
                         description="Consume TOPIC and publish its messages to other nsqd (nsq_to_nsq, in MPUB "
                                     "batches).", epilog=_EPILOG)
    add_consume_flags(sub, app="nsq_to_nsq")
    out = sub.add_argument_group("destination (nsq_to_nsq's flags)")
    out.add_argument("--destination-nsqd-tcp-address", action="append", type=nsqd_address_arg, default=[],
                     metavar="HOST:PORT", help="destination nsqd TCP address (may be given multiple times)")
    out.add_argument("--destination-lookupd-http-address", action="append", type=http_address_arg, default=[],
                     metavar="HOST:PORT", help="fastnsq's: publish to the nsqd this nsqlookupd lists for the "
                                               "destination topic (may be given multiple times)")
    out.add_argument("--destination-topic", type=topic_arg, default=None, metavar="TOPIC",
                     help="use this destination topic for all consumed topics (default is consumed topic name)")
    out.add_argument("--mode", choices=("round-robin", "hostpool", "epsilon-greedy"), default="hostpool",
                     help="the upstream request mode options: round-robin, hostpool (default), epsilon-greedy "
                          "(taken as hostpool)")
    out.add_argument("--sharding-key-json-field", default="", metavar="FIELD",
                     help="fastnsq's: on a partitioned (youzan HA) destination topic, the sharding key of each "
                          "message is this field of its JSON body: a key's messages go to one partition, in order "
                          "(needs --destination-lookupd-http-address)")
    out.add_argument("--producer-opt", action="append", default=[], metavar="NAME,VALUE",
                     help="option to pass through to the Producer (go-nsq's names; may be given multiple times)")
    out.add_argument("--status-every", type=int, default=250, metavar="N",
                     help="the # of requests between logging status (per destination), 0 disables")
    filters = sub.add_argument_group("JSON filter (nsq_to_nsq's flags)")
    filters.add_argument("--require-json-field", default="", metavar="FIELD",
                         help="for JSON messages: only pass messages that contain this field")
    filters.add_argument("--require-json-value", default="", metavar="VALUE",
                         help="for JSON messages: only pass messages in which the required field has this value")
    filters.add_argument("--whitelist-json-field", action="append", default=[], metavar="FIELD",
                         help="for JSON messages: pass this field (may be given multiple times)")
    sub.set_defaults(run=_run_to_nsq)


def _check(args: argparse.Namespace) -> None:
    if not args.topic or not args.channel:
        raise UsageError("--topic and --channel are required")
    require_servers(args)
    if not args.destination_nsqd_tcp_address and not args.destination_lookupd_http_address:
        raise UsageError("--destination-nsqd-tcp-address required (or fastnsq's --destination-lookupd-http-address)")
    if args.destination_nsqd_tcp_address and args.destination_lookupd_http_address:
        raise UsageError("use --destination-nsqd-tcp-address or --destination-lookupd-http-address, not both")
    if args.sharding_key_json_field and not args.destination_lookupd_http_address:
        raise UsageError("--sharding-key-json-field needs --destination-lookupd-http-address (the partitions "
                         "come from nsqlookupd)")
    if args.require_json_value and not args.require_json_field:
        raise UsageError("--require-json-value needs --require-json-field")
    if args.status_every < 0:
        raise UsageError(f"--status-every {args.status_every}: must be 0 (off) or more")


def _run_to_nsq(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    _check(args)
    producer = passthrough_options(args.producer_opt, for_="producer", flag="--producer-opt")
    return run_app_from(
        args, name="to-nsq", target="fastnsq.apps.to_nsq:ToNsq", topics=list(dict.fromkeys(args.topic)),
        batch_wait=0.005,  # a batch a quarter of max in flight: four MPUBs on the wire at once
        handler_options={
            "channel": args.channel, "destinations": args.destination_nsqd_tcp_address,
            "destination_lookupd": args.destination_lookupd_http_address,
            "destination_topic": args.destination_topic or "", "mode": args.mode, "producer_options": producer,
            "require_json_field": args.require_json_field, "require_json_value": args.require_json_value,
            "whitelist_json_fields": args.whitelist_json_field, "status_every": args.status_every,
            "sharding_key_json_field": args.sharding_key_json_field,
        },
    )
