"""``consumerkit topics create``: a topic on a local or test broker (the embedded Tansu one,
or a one-broker Kafka). The consumer creates no topics and refuses a missing one; production
topics are provisioned by their owners, with their replication and retention."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code
from aiokafka.protocol.metadata import MetadataRequest

from .check_broker import reach_broker
from .common import PARTITIONS_MAX, sub, whole
from .errors import CommandError

# Kafka's own rule for a topic's name
_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
TIMEOUT = 15.0


def topic_name(text: str) -> str:
    if not _NAME.fullmatch(text) or text in (".", ".."):
        raise argparse.ArgumentTypeError(
            f"invalid topic name {text!r}: 1 to 249 of the letters, digits, '.', '_' and '-'")
    return text


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topics = sub(commands, "topics", "create a topic on a local or test broker",
                 "Create a topic with replication factor 1, for a local or test broker such "
                 "as the embedded one; production topics are provisioned by their owners.")
    actions = topics.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = sub(actions, "create", "create a topic; one already present is left as it is")
    create.add_argument("name", type=topic_name, metavar="NAME", help="the topic's name")
    create.add_argument("--partitions", type=whole(1, PARTITIONS_MAX), default=4,
                        help="partitions")
    create.add_argument(
        "--kafka", default=None, metavar="HOST:PORT",
        help="bootstrap servers (default: $CONSUMERKIT_KAFKA_BOOTSTRAP)")
    create.set_defaults(handler=create_command)


async def create_command(args: argparse.Namespace) -> int:
    bootstrap = args.kafka or os.environ.get("CONSUMERKIT_KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise CommandError("no broker: pass --kafka HOST:PORT or set "
                           "CONSUMERKIT_KAFKA_BOOTSTRAP")
    created = await create_topic(bootstrap, args.name, args.partitions)
    print(f"topic {args.name}: {'created' if created else 'already present'}")
    return 0


async def create_topic(bootstrap: str, name: str, partitions: int) -> bool:
    """Create ``name`` and wait until every broker of the cluster lists it; False if it was
    there already."""
    if name in await reach_broker(bootstrap, {}):  # unreachable: a one-line StartupError
        return False
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap,
                                request_timeout_ms=int(TIMEOUT * 1000))
    try:
        await admin.start()
        response = await admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)])
        for topic, code, *detail in response.topic_errors:
            error = for_code(code)
            if code and error is not TopicAlreadyExistsError:
                reason = (detail[0] if detail and detail[0] else None) or error.__name__
                raise CommandError(f"cannot create topic {topic!r} on {bootstrap}: {reason}")
        await _listed_everywhere(admin, bootstrap, name, partitions)
    except KafkaError as exc:
        raise CommandError(f"cannot create topic {name!r} on {bootstrap}: {exc}") from exc
    finally:
        await admin.close()
    return True


async def _listed_everywhere(admin: AIOKafkaAdminClient, bootstrap: str, name: str,
                             partitions: int) -> None:
    """Wait until every broker of the cluster lists ``name`` with a leader for each of its
    partitions: a KRaft broker learns of a new topic when it replays the metadata log, so a
    consumer asking another broker right after creation could be told it is missing."""
    request = MetadataRequest([name], allow_auto_topic_creation=False)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT
    while True:
        await admin._client.force_metadata_update()  # the brokers the cluster has now
        nodes = [broker.nodeId for broker in admin._client.cluster.brokers()]
        behind = [node for node in nodes
                  if _ready(await admin._send_request(request, node), name) < partitions]
        if nodes and not behind:
            return
        if loop.time() > deadline:
            raise CommandError(
                f"topic {name!r} was created on {bootstrap} but broker(s) "
                f"{', '.join(map(str, behind)) or '?'} do not list it after {TIMEOUT:.0f} s")
        await asyncio.sleep(0.1)


def _ready(response: Any, name: str) -> int:
    """How many partitions of ``name`` a broker's metadata answer shows with a leader."""
    return sum(1 for topic in response.to_object()["topics"]
               if topic["topic"] == name and topic["error_code"] == 0
               for part in topic["partitions"] if part["error_code"] == 0 and part["leader"] >= 0)
