"""mqspark through Spark Connect: a Connect server started from the jars pyspark ships
(``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``, with Delta's
jars and mqspark on the server's Python path), and a client in a process of its own that reaches
it at ``sc://127.0.0.1:<port>``, registers the ``mq`` source and runs a streaming put, a
streaming get, the forwarding service, a routed put and an instance of a streaming get."""

from __future__ import annotations

import json
import uuid

import pytest
from chispa import assert_df_equality

import mqspark
from mqspark import MQValidationError, QueueManager
from mqspark.cluster.repository import Cluster

from .support.connect import connect_server as connect_server_at
from .support.processes import finish_driver, start_driver
from .test_stream_get import _expected_df, _reference

CLIENT = """
import json, sys
from pyspark.sql import SparkSession
import mqspark

url, root, source, checkpoints, output = sys.argv[1:6]
spark = SparkSession.builder.remote(url).getOrCreate()
mqspark.register(spark)
schema = "payload string, group_id string, msg_seq_number int, last_in_group boolean"
(spark.readStream.schema(schema).json(source)
    .writeStream.format("mq").option("queue", "Q").option("checkpointLocation", checkpoints + "/put")
    .trigger(availableNow=True).start(root).awaitTermination())
(spark.readStream.format("mq").option("queue", "Q").option("consumer", "c").option("maxMessagesPerTrigger", 4)
    .load(root).selectExpr("delivery_seq", "msg_id", "offset", "cast(payload as string) as payload")
    .writeStream.format("delta").option("checkpointLocation", checkpoints + "/get")
    .trigger(availableNow=True).start(output).awaitTermination())
service = "tests.support.service_functions:upper"
mqspark.forward(spark, root, "REQUESTS", service, exit_when_empty=True).awaitTermination()
print("done", flush=True)
"""

# A routed put (mqspark.route and the sink's cluster option), then a streaming get run as an
# instance of its service, its foreachBatch fenced by the instance: the fence is pickled to the server.
SERVICES_CLIENT = """
import collections, json, sys
from pyspark.sql import SparkSession
import mqspark
from mqspark import QueueManager
from mqspark.services.instances import Instance

url, root, source, checkpoints, output = sys.argv[1:6]
spark = SparkSession.builder.remote(url).getOrCreate()
mqspark.register(spark)
orders = spark.read.schema("payload string").json(source)
routed = mqspark.route(orders, cluster="INVENTORY", queue="ORDERS", from_qmgr=root, bind="not_fixed").collect()
print("route", json.dumps(collections.Counter(row.target_qmgr for row in routed)), flush=True)
(spark.readStream.schema("payload string").json(source)
    .writeStream.format("mq").option("queue", "ORDERS").option("cluster", "INVENTORY").option("bind", "not_fixed")
    .option("checkpointLocation", checkpoints + "/put").trigger(availableNow=True).start(root).awaitTermination())
instance = Instance(QueueManager.open(root), "Q", "ha", spark=spark)


def deliver(batch, batch_id):
    batch.write.format("delta").mode("append").option("txnAppId", "ha").option("txnVersion", batch_id).save(output)


def start(instance_id):
    return (spark.readStream.format("mq").option("queue", "Q").option("consumer", "ha")
        .option("maxMessagesPerTrigger", 2).option("instance", instance_id).load(root)
        .selectExpr("delivery_seq", "msg_id", "offset", "cast(payload as string) as payload")
        .writeStream.foreachBatch(instance.fence(deliver)).option("checkpointLocation", checkpoints + "/get")
        .trigger(availableNow=True).start())


instance.run(start).awaitTermination()
print("done", flush=True)
"""


def _run_client(script: str, connect_server: str, root: str, source, tmp_path) -> str:
    """Run ``script`` as a Connect client in a process of its own; its output."""
    path = tmp_path / "client.py"
    path.write_text(script)
    token = uuid.uuid4().hex
    log = tmp_path / "client.log"
    arguments = [str(path), connect_server, root, str(source), str(tmp_path / "checkpoints"), str(tmp_path / "output")]
    client = start_driver(arguments, log, token)
    assert finish_driver(client, token, timeout=300) == 0, log.read_text()[-3000:]
    assert "done" in log.read_text().splitlines()
    return log.read_text()


def _source(tmp_path, rows: list[dict]):
    source = tmp_path / "input"
    source.mkdir()
    (source / "part-0.json").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return source


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """The server's URL; the server runs for the module's tests."""
    with connect_server_at(tmp_path_factory.mktemp("connect")) as url:
        yield url


@pytest.mark.spark
def test_a_streaming_put_a_streaming_get_in_logical_order_and_the_forwarder_through_spark_connect(
    spark, connect_server, qm, tmp_path
):
    qm.define_queue("Q", delivery_sequence="fifo")
    qm.define_queue("REQUESTS")
    qm.define_queue("REPLIES")
    qm.put("REQUESTS", [{"payload": f"r{i}", "correl_id": f"c{i}", "reply_to_queue": "REPLIES"} for i in range(4)])
    rows = [{"payload": f"u{n}"} for n in range(3)]
    rows += [{"payload": f"g{n}", "group_id": "G", "msg_seq_number": n, "last_in_group": n == 3} for n in (3, 1, 2)]
    _run_client(CLIENT, connect_server, qm.root, _source(tmp_path, rows), tmp_path)
    got = spark.read.format("delta").load(str(tmp_path / "output")).orderBy("delivery_seq")
    assert_df_equality(got, _expected_df(spark, _reference(qm)), ignore_nullable=True)
    assert [row["payload"] for row in got.collect()] == ["u0", "u1", "u2", "g1", "g2", "g3"]
    assert qm.depth("Q", consumer="c") == 0
    replies = qm.browse("REPLIES")
    assert dict(zip(replies["correl_id"].to_pylist(), replies["payload"].to_pylist(), strict=True)) == {
        f"c{i}": f"R{i}".encode() for i in range(4)
    }
    assert qm.depth("REQUESTS", consumer="forward") == 0


@pytest.mark.spark
def test_a_routed_put_and_a_fenced_instance_of_a_streaming_get_through_spark_connect(
    spark, connect_server, qm, tmp_path
):
    repository = Cluster.create(str(tmp_path / "cluster"), "INVENTORY")
    repository.join(qm)
    replicas = {name: QueueManager.create(str(tmp_path / name), name) for name in ("QM2", "QM3")}
    for replica in replicas.values():
        repository.join(replica)
        replica.define_queue("ORDERS")
        repository.advertise(replica, "ORDERS")
    qm.define_queue("Q", delivery_sequence="fifo")
    qm.put("Q", [{"payload": "a"}, {"payload": "g2", "group_id": "G", "msg_seq_number": 2, "last_in_group": True}])
    qm.put("Q", [{"payload": "g1", "group_id": "G", "msg_seq_number": 1}, {"payload": "b"}])
    expected = _reference(qm)
    output = _run_client(
        SERVICES_CLIENT, connect_server, qm.root, _source(tmp_path, [{"payload": f"o{n}"} for n in range(6)]), tmp_path
    )
    routed = [json.loads(line.split(maxsplit=1)[1]) for line in output.splitlines() if line.startswith("route ")]
    assert routed == [{"QM2": 3, "QM3": 3}], output[-3000:]
    placed = {
        name: sorted(p.decode() for p in r.browse("ORDERS")["payload"].to_pylist()) for name, r in replicas.items()
    }
    assert sorted(placed["QM2"] + placed["QM3"]) == [f"o{n}" for n in range(6)]
    assert [len(payloads) for payloads in placed.values()] == [3, 3]
    got = spark.read.format("delta").load(str(tmp_path / "output")).orderBy("delivery_seq")
    assert_df_equality(got, _expected_df(spark, expected), ignore_nullable=True)
    assert [row["payload"] for row in got.collect()] == ["a", "g1", "g2", "b"]
    assert qm.depth("Q", consumer="ha") == 0


def test_mqspark_session_refuses_spark_connect_and_says_what_to_do(monkeypatch):
    monkeypatch.setenv("SPARK_REMOTE", "sc://127.0.0.1:15002")
    with pytest.raises(MQValidationError) as refused:
        mqspark.session()
    assert str(refused.value) == (
        "mqspark.session() starts a Spark driver here, but SPARK_REMOTE=sc://127.0.0.1:15002 asks for Spark "
        "Connect: use SparkSession.builder.remote('sc://127.0.0.1:15002').getOrCreate(), then "
        "mqspark.register(spark) (the Connect server needs Delta's jars and mqspark installed)"
    )
