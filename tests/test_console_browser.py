"""The console in a real browser: Debian's Chromium, driven by Selenium through its chromedriver,
against ``mqspark console`` running as its own process. Each test saves screenshots of the pages it
visits into ``.pytest-screenshots/`` (the README shows two of them)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from mqspark import QueueManager
from mqspark.console.reads import BUSY_REFRESH_SECONDS
from mqspark.services.monitor import Monitor

from .support.processes import free_port, start_server, stop_server

# Each test drives a real Chromium against a console server: processes, and seconds each.
pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCREENSHOTS = Path(__file__).resolve().parent.parent / ".pytest-screenshots"
TOKEN = "browser-token"
SCRIPT = "<script>alert('x')</script>"


@pytest.fixture
def console(qm: QueueManager, tmp_path: Path) -> Iterator[str]:
    """``mqspark console --admin`` over ``qm`` in its own process; its base URL once it listens."""
    port = free_port()
    command = [sys.executable, "-m", "mqspark.cli", "console", "--root", qm.root, "--port", str(port)]
    process = start_server([*command, "--admin", "--token", TOKEN], tmp_path / "console.log", port, "the console")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(process)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1280,900",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _screenshot(driver: WebDriver, name: str) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def _wait_for(driver: WebDriver, how: str, what: str):
    return WebDriverWait(driver, 20).until(lambda d: d.find_element(how, what))


def test_from_the_overview_to_a_queue_its_messages_and_one_message(
    qm: QueueManager, console: str, browser: WebDriver
) -> None:
    qm.define_queue("ORDERS", description="orders from the shop")
    qm.put("ORDERS", [{"payload": b'{"order": 1}', "priority": 4}, {"payload": b"second"}])
    qm.get("ORDERS", "billing")
    browser.get(console)
    _screenshot(browser, "overview")
    browser.find_element(By.LINK_TEXT, "ORDERS").click()
    assert _wait_for(browser, By.ID, "depth").text == "1"
    group = browser.find_elements(By.CSS_SELECTOR, "#groups tbody tr td")
    assert [cell.text for cell in group[:2]] == ["billing", "1"]
    _screenshot(browser, "queue")
    browser.find_element(By.ID, "browse").click()
    rows = _wait_for(browser, By.ID, "messages").find_elements(By.CSS_SELECTOR, "tbody tr")
    assert [row.find_elements(By.TAG_NAME, "td")[-1].text for row in rows] == ['{"order": 1}', "second"]
    _screenshot(browser, "messages")
    rows[0].find_element(By.TAG_NAME, "a").click()
    browser.find_element(By.LINK_TEXT, "json").click()
    assert _wait_for(browser, By.ID, "payload").text == '{\n  "order": 1\n}'
    _screenshot(browser, "message")


def test_the_overview_refreshes_its_rows_and_when_they_were_read(
    qm: QueueManager, console: str, browser: WebDriver
) -> None:
    qm.define_queue("Q")
    browser.get(console)
    first = _wait_for(browser, By.ID, "updated").text
    depth = """
        const row = [...document.querySelectorAll('#queues-body tr')].find(r => r.cells[1].textContent.trim() === 'Q');
        return row ? row.cells[3].textContent.trim() : null;
    """
    assert browser.execute_script(depth) == "0"
    qm.put("Q", [{"payload": b"x"}])
    # The rows poll every 5 s; the console reads its answers again every 5 s while clients ask, and
    # every BUSY_REFRESH_SECONDS while other processes (this browser, another test) keep the machine busy.
    WebDriverWait(browser, BUSY_REFRESH_SECONDS + 30).until(lambda driver: driver.execute_script(depth) == "1")
    shown = browser.execute_script("return [...document.querySelectorAll('#updated')].map(e => e.textContent)")
    assert len(shown) == 1 and shown[0] > first, (first, shown)
    assert browser.find_element(By.ID, "updated").find_elements(By.XPATH, "ancestor::table") == []


def test_a_script_payload_shows_as_text_and_runs_nothing(qm: QueueManager, console: str, browser: WebDriver) -> None:
    qm.define_queue("Q")
    [msg_id] = qm.put("Q", [{"payload": SCRIPT.encode(), "properties": {"note": SCRIPT}}])
    browser.get(f"{console}/qmgr/QM1/queue/Q/messages")
    cell = _wait_for(browser, By.CSS_SELECTOR, "#messages tbody td.payload")
    assert cell.text == SCRIPT
    browser.get(f"{console}/qmgr/QM1/queue/Q/messages/{msg_id}")
    assert _wait_for(browser, By.ID, "payload").text == SCRIPT
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - reading it is what raises when no alert is open


def test_a_put_without_the_token_is_refused_and_with_a_signed_in_session_it_lands(
    qm: QueueManager, console: str, browser: WebDriver
) -> None:
    qm.define_queue("Q")
    browser.get(console)
    put = """
        const done = arguments[arguments.length - 1];
        const token = document.querySelector('meta[name="csrf-token"]');
        fetch('/api/v1/qmgr/QM1/queue/Q/message', {method: 'POST', body: 'from the page',
              headers: token ? {'X-CSRF-Token': token.content} : {}})
          .then(async (r) => done([r.status, await r.text()]));
    """
    status, text = browser.execute_async_script(put)
    assert status == 401 and '"reason":2035' in text
    browser.find_element(By.NAME, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "form.sign-in button").click()
    _wait_for(browser, By.CSS_SELECTOR, 'meta[name="csrf-token"]')
    status, text = browser.execute_async_script(put)
    assert status == 201, text
    assert qm.browse("Q")["payload"].to_pylist() == [b"from the page"]


def test_the_queue_page_charts_the_monitor_history(qm: QueueManager, console: str, browser: WebDriver) -> None:
    qm.define_queue("Q")
    qm.put("Q", [{"payload": b"x"}] * 5)
    qm.declare_consumer("Q", "g")
    monitor = Monitor(qm, "Q", "g", watch_interval=1, watch_count=1, expected_count=10)
    start = datetime.now(UTC) - timedelta(minutes=3)
    for second in range(0, 120, 10):
        monitor.point(start + timedelta(seconds=second))
    browser.get(f"{console}/qmgr/QM1/queue/Q")
    charts = WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#charts .chart canvas"))
    assert len(charts) == 3
    drawn = browser.find_elements(By.CSS_SELECTOR, "#charts .chart")
    assert [(chart.get_attribute("data-series"), chart.get_attribute("data-points")) for chart in drawn] == [
        ("depth", "12"),
        ("oldest_claimable_age_s", "12"),
        ("rate_per_s", "12"),
    ]
    legend = browser.find_element(By.CSS_SELECTOR, "#charts .chart .u-legend").text
    assert "g warn" in legend and "g abort" in legend
    _screenshot(browser, "queue-charts")


def test_a_redrive_from_the_dead_letters_page_puts_the_message_back(
    qm: QueueManager, console: str, browser: WebDriver
) -> None:
    qm.define_queue("Q.BACKOUT")
    qm.define_queue("Q", backout_queue="Q.BACKOUT", backout_threshold=1)
    qm.put("Q", [{"payload": b"poison"}, {"payload": b"fine"}])
    with pytest.raises(RuntimeError), qm.syncpoint_get("Q", "g"):
        raise RuntimeError("could not parse")
    assert qm.get("Q", "g")["payload"].to_pylist() == [b"fine"]
    browser.get(console)
    browser.find_element(By.NAME, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "form.sign-in button").click()
    _wait_for(browser, By.CSS_SELECTOR, 'meta[name="csrf-token"]')
    browser.find_element(By.LINK_TEXT, "Dead letters").click()
    browser.find_element(By.LINK_TEXT, "Q.BACKOUT").click()
    row = _wait_for(browser, By.CSS_SELECTOR, "#dead-letters tbody tr")
    assert "last error: RuntimeError: could not parse" in row.text
    _screenshot(browser, "dead-letters")
    row.find_element(By.NAME, "msg_id").click()
    browser.find_element(By.ID, "redrive-selected").click()
    # htmx swaps the progress in every second until the redrive ends: an element found may be
    # replaced before it is read.
    WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: d.find_element(By.ID, "redrive-state").get_attribute("data-state") == "done"
    )
    assert browser.find_element(By.ID, "redrive-moved").text == "1 back to Q"
    _screenshot(browser, "redrive")
    assert qm.get("Q", "g")["payload"].to_pylist() == [b"poison"]
    assert qm.depth("Q.BACKOUT") == 0


def test_a_queue_whose_name_holds_a_percent_sign_is_reached_through_its_links(
    qm: QueueManager, console: str, browser: WebDriver
) -> None:
    qm.define_queue("Q%41")
    qm.define_queue("QA")
    qm.put("Q%41", [{"payload": b"mine"}])
    qm.put("QA", [{"payload": b"not mine"}])
    browser.get(console)
    browser.find_element(By.LINK_TEXT, "Q%41").click()
    browser.find_element(By.ID, "browse").click()
    cells = _wait_for(browser, By.ID, "messages").find_elements(By.CSS_SELECTOR, "tbody td.payload")
    assert [cell.text for cell in cells] == ["mine"]
