"""The notebooks run top to bottom in a real Jupyter kernel and show what their text promises."""

from __future__ import annotations

import ast
import json
import re
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).parents[1] / "notebooks"
NOTEBOOK = NOTEBOOKS / "quickstart.ipynb"
MONITORING = NOTEBOOKS / "monitoring.ipynb"
KERNEL = "mqspark-tests"


@pytest.fixture
def kernel_name(tmp_path, monkeypatch) -> str:
    """A kernel spec running this interpreter (the one with mqspark), found through JUPYTER_PATH."""
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return KERNEL


def tagged(nb: nbformat.NotebookNode, tag: str) -> nbformat.NotebookNode:
    (cell,) = [cell for cell in nb.cells if tag in cell.metadata.get("tags", [])]
    return cell


def result_text(cell: nbformat.NotebookNode) -> str:
    (result,) = [output for output in cell.outputs if output.output_type == "execute_result"]
    return result.data["text/plain"]


def stdout_text(cell: nbformat.NotebookNode) -> str:
    return "".join(output.text for output in cell.outputs if output.output_type == "stream" and output.name == "stdout")


def show_rows(text: str) -> list[list[str]]:
    """Header and rows of a DataFrame.show() table."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[value.strip() for value in line.strip("|").split("|")] for line in rows]


@pytest.mark.parametrize(("notebook", "least"), [(NOTEBOOK, 10), (MONITORING, 6)], ids=["quickstart", "monitoring"])
def test_notebook_is_stored_without_outputs(notebook, least):
    nb = nbformat.read(notebook, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert len(code) >= least
    assert [(cell.outputs, cell.execution_count) for cell in code] == [([], None)] * len(code)


@pytest.mark.slow
@pytest.mark.spark
def test_quickstart_notebook_runs(tmp_path, kernel_name):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name=kernel_name, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first cell that fails

    errors = [
        output
        for cell in nb.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "error"
    ]
    assert errors == []

    assert result_text(tagged(nb, "depth")) == "{'ORDERS': 6, 'REPLIES': 2, 'SYSTEM.DEAD.LETTER.QUEUE': 0}"

    # Priority delivery puts the priority-9 message first; fifo keeps put order whatever the priority.
    orders = result_text(tagged(nb, "browse-orders"))
    payloads = ["rush order", "order 1", "order 2", "basket item 1", "basket item 2", "basket item 3"]
    positions = [orders.find(payload) for payload in payloads]
    assert -1 not in positions and positions == sorted(positions), orders
    replies = result_text(tagged(nb, "browse-replies"))
    assert -1 < replies.find("reply 1") < replies.find("reply 2"), replies

    attributes = result_text(tagged(nb, "inquire"))
    assert "'name': 'ORDERS'" in attributes and "'default_priority': 4" in attributes

    # mqspark.brief: the columns a person reads first, the payload as text. msg_id and put_time differ
    # each run: their form is checked, the rest exactly.
    header, *rows = show_rows(stdout_text(tagged(nb, "spark-mq")))
    assert header == ["delivery_seq", "queue", "priority", "msg_id", "correl_id", "group_id"] + [
        "msg_seq_number",
        "backout_count",
        "put_time",
        "payload",
    ]
    timestamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?"
    assert all(re.fullmatch("[0-9a-f]{32}", row[3]) and re.fullmatch(timestamp, row[8]) for row in rows), rows
    assert [[*row[:3], *row[4:8], row[9]] for row in rows] == [
        ["0", "ORDERS", "9", "NULL", "NULL", "1", "0", "rush order"],
        ["1", "ORDERS", "4", "NULL", "NULL", "1", "0", "order 1"],
        ["2", "ORDERS", "4", "C2", "NULL", "1", "0", "order 2"],
        ["3", "ORDERS", "4", "NULL", "BASKET-7", "1", "0", "basket item 1"],
        ["4", "ORDERS", "4", "NULL", "BASKET-7", "2", "0", "basket item 2"],
        ["5", "ORDERS", "4", "NULL", "BASKET-7", "3", "0", "basket item 3"],
    ]

    location, *table = stdout_text(tagged(nb, "spark-delta")).splitlines()
    assert show_rows("\n".join(table)) == [["priority", "count"], ["4", "5"], ["9", "1"]]
    # The queue manager lived in a temporary folder, which the last cell removed.
    assert location.startswith(tempfile.gettempdir()) and location.endswith("/qm/queues/ORDERS")
    assert not Path(location).parents[2].exists()

    replies = result_text(tagged(nb, "spark-put"))
    assert -1 < replies.find("reply 2") < replies.find("reply 3") < replies.find("reply 4"), replies
    assert stdout_text(tagged(nb, "segments")).splitlines() == [
        "[b'a messag', b'e in sev', b'eral pie', b'ces']",
        "[b'a message in several pieces']",
    ]
    assert stdout_text(tagged(nb, "forward")).splitlines() == [
        "['Q1'] [b'0.40']",
        "[b'plum'] retry count 1 of queue QUOTES used up after 2 failed deliveries; "
        "last error: ServiceError: no price for plum (return code 404)",
    ]
    assert stdout_text(tagged(nb, "request")).splitlines() == ["[b'0.55']"]


@pytest.mark.slow
@pytest.mark.spark
def test_monitoring_notebook_warns_recovers_aborts_and_plots_the_history(tmp_path, kernel_name):
    nb = nbformat.read(MONITORING, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name=kernel_name, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first cell that fails

    # The slow consumer recovered: the warning monitor's last points are back under the watch count.
    recovered = result_text(tagged(nb, "recover"))
    assert recovered.count(" watching continue status=OK ") == 3, recovered
    aborted = stdout_text(tagged(nb, "abort")).splitlines()
    assert aborted[0] == "StreamingQueryException", (aborted, stdout_text(tagged(nb, "history")))
    assert aborted[1].startswith(
        "MQRC_Q_SERVICE_INTERVAL_HIGH (2226): queue ORDERS: consumer group 'billing' is falling behind: it processed A="
    )
    verdicts, events, status = stdout_text(tagged(nb, "history")).splitlines()
    counts = ast.literal_eval(verdicts)
    assert counts[("warning", "warn")] >= 1 and counts[("aborting", "abort")] == 1
    assert set(counts) <= {
        ("warning", "continue"),
        ("warning", "warn"),
        ("aborting", "continue"),
        ("aborting", "abort"),
    }
    assert events == "['MQRC_Q_DEPTH_HIGH (2224)', 'MQRC_Q_DEPTH_LOW (2225)']"
    assert status == "STOP"
    (plot,) = [output for output in tagged(nb, "plot").outputs if output.output_type == "display_data"]
    assert plot.data["image/png"] and plot.data["text/plain"] == "<Figure size 900x800 with 3 Axes>"
