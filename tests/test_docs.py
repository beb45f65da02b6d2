"""The user's documents (the README and docs/) hold together and their code blocks run as they are
written, against a real queue manager and Spark session, and do what the text around them says."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

import mqspark
from mqspark import Reason

from .support.docs import (
    DOCUMENTS,
    PROJECT,
    PYTHON,
    Plan,
    anchor,
    block_under,
    code_blocks,
    headings,
    plan,
    relative_links,
    run_block,
    run_in_document,
    runnable_blocks,
)

FAILED_MESSAGES = "docs/failed-messages.md"
# The design document shows layouts and sketches, not code to run.
USER_DOCUMENTS = tuple(document for document in DOCUMENTS if document != "docs/architecture.md")


BLOCKS = [
    pytest.param(document, block, id=f"{document}:{block.line}", marks=[pytest.mark.spark] * (block.language in PYTHON))
    for document, block in runnable_blocks(USER_DOCUMENTS)
]


@pytest.mark.slow
@pytest.mark.parametrize(("document", "block"), BLOCKS)
def test_every_python_and_shell_block_runs(document, block, request, tmp_path):
    """Every Python and shell block of the README and docs/ runs as written, as its marker says
    (tests/support/docs.py), or is skipped for the reason its marker gives."""
    reason = plan(block)
    if isinstance(reason, str):
        if block.language in PYTHON:
            compile(block.code, f"{document}:{block.line}", "exec")
        pytest.skip(f"{document}:{block.line}: {reason}")
    spark = request.getfixturevalue("spark") if block.language in PYTHON else None
    run_in_document(document, block, tmp_path, spark)


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(document):
    for target in relative_links(document):
        path, _, fragment = target.partition("#")
        linked = str(PurePosixPath(document).parent / path) if path else document
        assert (PROJECT / linked).exists(), f"{document}: link {target}: no {linked}"
        if fragment and linked.endswith(".md"):
            assert fragment in {anchor(heading) for heading in headings(linked)}, f"{document}: link {target}"


def test_markers_say_how_a_block_runs_and_why_it_does_not(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- run: id=a; after=b,c; setup=qm,orders; exit=2 -->\n```bash\ntrue\n```\n"
        "<!-- not run: needs a cluster -->\n```python\npass\n```\n"
        "<!-- not run:  -->\n```python\npass\n```\n"
        "<!-- run: setup=nothing-like-it -->\n```python\npass\n```\n"
        "<!-- run: wait=5 -->\n```python\npass\n```\n"
    )
    runs, skipped, unexplained, unknown, bad = code_blocks(str(page))
    assert plan(runs) == Plan(id="a", after=("b", "c"), setup=("qm", "orders"), exit=2)
    assert plan(skipped) == "needs a cluster"
    for block, error in ((unexplained, "must say why"), (unknown, "unknown setup"), (bad, "bad marker item")):
        with pytest.raises(ValueError, match=error):
            plan(block)


def test_the_reason_code_reference_lists_every_reason():
    text = (PROJECT / "docs/reference/reason-codes.md").read_text()
    missing = [reason.name for reason in Reason if f"| {reason.value} | `{reason.name}` |" not in text]
    assert not missing


def test_the_failed_messages_example_backs_out_what_it_rejects_and_writes_the_rest(spark, qm, tmp_path):
    """The failed-messages guide's first example: a foreachBatch that backs out the messages it
    rejects and writes the others to Delta (it once failed on every batch: ``subtract`` cannot
    compare the ``properties`` map)."""
    qm.define_queue("ORDERS.BACKOUT")
    qm.define_queue("ORDERS", backout_threshold=1, backout_queue="ORDERS.BACKOUT")
    rejected = b"x" * 1001
    qm.put("ORDERS", [{"payload": "order 1"}, {"payload": rejected}, {"payload": "order 2"}])
    out, ck = str(tmp_path / "billed"), str(tmp_path / "checkpoint")
    block = block_under(FAILED_MESSAGES, "Failed messages: backout, retry, error and dead-letter queues")
    run_block(block, FAILED_MESSAGES, {"spark": spark, "mqspark": mqspark, "root": qm.root, "out": out, "ck": ck})
    (query,) = spark.streams.active
    try:
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()
    written = spark.read.format("delta").load(out).orderBy("delivery_seq").collect()
    assert [bytes(row.payload) for row in written] == [b"order 1", b"order 2"]
    moved = qm.browse("ORDERS.BACKOUT")
    assert moved["payload"].to_pylist() == [rejected]
    assert moved["dlq_original_queue"].to_pylist() == ["ORDERS"]
    assert qm.depth("ORDERS", consumer="billing") == 0
