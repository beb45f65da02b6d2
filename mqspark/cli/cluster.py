"""The ``mqspark cluster`` commands: cluster repositories (create, maintain), membership (join, leave,
suspend, resume, route state, network priority), advertised queues, the health check and what a
repository shows."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from mqspark.cli.parser import Commands, duration, open_engine
from mqspark.cluster.records import ROUTE_STATES
from mqspark.cluster.repository import Cluster
from mqspark.engine.maintenance import DEFAULT_RETENTION


def add_cluster(commands: Commands, output: argparse.ArgumentParser) -> None:
    """``cluster`` and its actions, each naming the cluster by its root or by a cluster the ``--root``
    queue manager has joined (but ``create``)."""
    cluster = commands.add_parser(
        "cluster",
        help="cluster repositories: create, join, leave, advertise queues, route states, health check",
        description="Every command but create names the cluster with --cluster-root CLUSTER_ROOT, or with "
        "--cluster NAME, a cluster the --root queue manager has joined. --qmgr defaults to the --root queue manager.",
    ).add_subparsers(dest="action", required=True)
    create = cluster.add_parser(
        "create", parents=[output], help="create the repository of cluster NAME at CLUSTER_ROOT"
    )
    create.add_argument("name", metavar="NAME")
    create.add_argument("cluster_root", metavar="CLUSTER_ROOT")
    create.set_defaults(handler=_create)

    which = argparse.ArgumentParser(add_help=False)
    named = which.add_mutually_exclusive_group(required=True)
    named.add_argument("--cluster-root", metavar="CLUSTER_ROOT", help="root of the cluster repository")
    named.add_argument("--cluster", metavar="NAME", help="a cluster the --root queue manager has joined")
    member = argparse.ArgumentParser(add_help=False)
    member.add_argument("--qmgr", metavar="QMGR", help="the member (default: the --root queue manager)")

    join = cluster.add_parser("join", parents=[output, which], help="the --root queue manager joins the cluster")
    join.add_argument(
        "--network-priority",
        type=int,
        default=0,
        metavar="0-9",
        help="0-9, routing prefers the members of highest priority (default 0)",
    )
    join.set_defaults(handler=_join)
    cluster.add_parser(
        "leave", parents=[output, which, member], help="a member leaves, with its advertisements"
    ).set_defaults(handler=_leave)
    advertise = cluster.add_parser(
        "advertise", parents=[output, which], help="advertise a local queue of the --root queue manager"
    )
    advertise.add_argument("queue", metavar="QUEUE")
    advertise.set_defaults(handler=_advertise)
    unadvertise = cluster.add_parser(
        "unadvertise", parents=[output, which, member], help="withdraw a member's advertisement of QUEUE"
    )
    unadvertise.add_argument("queue", metavar="QUEUE")
    unadvertise.set_defaults(handler=_unadvertise)
    _add_member_actions(cluster, [output, which, member])
    show = cluster.add_parser("show", parents=[output, which], help="the members (or advertised queues, or bindings)")
    shown = show.add_mutually_exclusive_group()
    shown.add_argument("--queues", action="store_true", help="show the advertised queues")
    shown.add_argument("--bindings", action="store_true", help="show the bindings of producers and groups")
    show.add_argument(
        "--snapshot",
        type=int,
        metavar="VERSION",
        help="as at this version number of the repository's table (default: the latest)",
    )
    show.set_defaults(handler=_show)
    trim = cluster.add_parser(
        "maintain",
        parents=[output, which],
        help="trim the repository's history, keeping every snapshot a producer's replay may route with",
    )
    trim.add_argument(
        "--retention",
        type=duration,
        default=DEFAULT_RETENTION,
        help="keep the history this long: seconds, or a number with s, m, h or d (default 1h)",
    )
    trim.set_defaults(handler=_maintain)
    refresh = cluster.add_parser(
        "refresh", parents=[output, which], help="health-check every member, then show the members"
    )
    refresh.add_argument(
        "--active-within",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="seconds: a member is running when a consumer group of a queue it advertises renewed its "
        "lease this recently (default 300)",
    )
    refresh.set_defaults(handler=_refresh)


def _add_member_actions(cluster: Commands, parents: list[argparse.ArgumentParser]) -> None:
    """``suspend``, ``resume``, ``route-state`` and ``priority``: a member's routing, which each shows."""
    cluster.add_parser("suspend", parents=parents, help="suspend a member (routing prefers resumed ones)").set_defaults(
        handler=_suspend
    )
    cluster.add_parser("resume", parents=parents, help="resume a suspended member").set_defaults(handler=_resume)
    route_state = cluster.add_parser(
        "route-state",
        parents=parents,
        help="set a member's route state, kept by the health check; auto hands it back to the health check",
    )
    route_state.add_argument(
        "state", choices=[*ROUTE_STATES, "auto"], metavar="STATE", help=f"{', '.join(ROUTE_STATES)} or auto"
    )
    route_state.add_argument("--by", help="who sets it, any text (default: the operating-system user)")
    route_state.set_defaults(handler=_route_state)
    priority = cluster.add_parser("priority", parents=parents, help="set a member's network priority (0-9)")
    priority.add_argument("network_priority", type=int, metavar="N")
    priority.set_defaults(handler=_priority)


def _create(args: argparse.Namespace) -> dict[str, Any]:
    cluster = Cluster.create(args.cluster_root, args.name)
    return {"cluster": cluster.name, "root": cluster.root}


def _open(args: argparse.Namespace) -> Cluster:
    """The cluster named by ``--cluster-root``, or by ``--cluster`` through the ``--root`` queue manager."""
    if args.cluster_root is not None:
        return Cluster.open(args.cluster_root)
    return Cluster.open(open_engine(args.root, args.clock).cluster_repository(args.cluster))


def _member(args: argparse.Namespace) -> str:
    """The member acted on: ``--qmgr``, or the ``--root`` queue manager."""
    return args.qmgr or open_engine(args.root, args.clock).name


def _rows(items: Sequence[Any]) -> list[dict[str, Any]]:
    """Cluster objects as table rows; every row is of the one cluster shown."""
    return [{key: value for key, value in dataclasses.asdict(item).items() if key != "cluster"} for item in items]


def _show(args: argparse.Namespace) -> list[dict[str, Any]]:
    snapshot = _open(args).snapshot(args.snapshot)
    return _rows(snapshot.queues if args.queues else snapshot.bindings if args.bindings else snapshot.members)


def _refresh(args: argparse.Namespace) -> list[dict[str, Any]]:
    return _rows(_open(args).refresh(active_within=args.active_within).members)


def _maintain(args: argparse.Namespace) -> dict[str, Any]:
    cluster = _open(args)
    return {"cluster": cluster.name, **cluster.maintain(args.retention)}


def _join(args: argparse.Namespace) -> dict[str, Any]:
    cluster = _open(args)
    return dataclasses.asdict(cluster.join(open_engine(args.root, args.clock), network_priority=args.network_priority))


def _advertise(args: argparse.Namespace) -> dict[str, Any]:
    cluster = _open(args)
    return dataclasses.asdict(cluster.advertise(open_engine(args.root, args.clock), args.queue))


def _leave(args: argparse.Namespace) -> dict[str, Any]:
    cluster = _open(args)
    qmgr = _member(args)
    cluster.leave(qmgr)
    return {"cluster": cluster.name, "left": qmgr}


def _unadvertise(args: argparse.Namespace) -> dict[str, Any]:
    cluster = _open(args)
    qmgr = _member(args)
    cluster.unadvertise(qmgr, args.queue)
    return {"cluster": cluster.name, "qmgr": qmgr, "unadvertised": args.queue}


def _suspend(args: argparse.Namespace) -> dict[str, Any]:
    cluster = _open(args)
    return dataclasses.asdict(cluster.suspend(_member(args)))


def _resume(args: argparse.Namespace) -> dict[str, Any]:
    cluster = _open(args)
    return dataclasses.asdict(cluster.resume(_member(args)))


def _route_state(args: argparse.Namespace) -> dict[str, Any]:
    cluster = _open(args)
    state = None if args.state == "auto" else args.state
    return dataclasses.asdict(cluster.set_route_state(_member(args), state, by=args.by))


def _priority(args: argparse.Namespace) -> dict[str, Any]:
    cluster = _open(args)
    return dataclasses.asdict(cluster.set_network_priority(_member(args), args.network_priority))
