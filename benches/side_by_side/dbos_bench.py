"""DBOS Transact's side of the side-by-side benchmark (see src/main.rs).

Usage: dbos_bench.py URL CALLS TASK_CALLS, URL as idem's testkit makes it
(postgres://postgres@/DB?host=SOCKET_DIR&port=PORT). Prints one row of
the benchmark's table: the floor (single-row commits on a plain psycopg
connection, sampled in turn with the fresh calls), a fresh workflow of one
step started under SetWorkflowID, its replay (the same workflow id again),
and 64 threads of fresh workflows.
"""

import statistics
import sys
import time
from importlib.metadata import version
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlparse

import psycopg
from dbos import DBOS, SetWorkflowID

url, calls, task_calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
parsed = urlparse(url)
query = parse_qs(parsed.query)
db = parsed.path.lstrip("/")
socket_dir, port = query["host"][0], query["port"][0]
conninfo = f"postgresql://postgres@/{db}?host={socket_dir}&port={port}"

DBOS(config={"name": "side-by-side", "system_database_url": conninfo, "sys_db_pool_size": 70})


@DBOS.step()
def noop(n: int) -> int:
    return n


@DBOS.workflow()
def call(n: int) -> int:
    return noop(n)


def run(n: int) -> None:
    with SetWorkflowID(f"bench-{n}"):
        assert call(n) == n


def p50(samples):
    return statistics.median(samples) * 1e6


DBOS.launch()
floor = psycopg.connect(conninfo, autocommit=True)
floor.execute("CREATE TABLE floor (id bigint PRIMARY KEY, body bytea NOT NULL)")
body = b"\xa5" * 128
for n in range(1_000_000, 1_000_100):
    run(n)
floors, fresh, replays = [], [], []
for n in range(calls):
    t = time.perf_counter()
    floor.execute("INSERT INTO floor VALUES (%s, %s)", (n, body))
    floors.append(time.perf_counter() - t)
    t = time.perf_counter()
    run(n)
    fresh.append(time.perf_counter() - t)
for n in range(calls):
    t = time.perf_counter()
    run(n)
    replays.append(time.perf_counter() - t)


def task(i: int) -> None:
    for k in range(task_calls):
        run(2_000_000 + i * task_calls + k)


started = time.perf_counter()
with ThreadPoolExecutor(max_workers=64) as pool:
    list(pool.map(task, range(64)))
rate = 64 * task_calls / (time.perf_counter() - started)
print(
    f"| DBOS Transact {version('dbos')} (Python) | {p50(floors):.0f} µs | {p50(fresh):.0f} µs "
    f"| {p50(replays):.0f} µs | {rate:.0f} calls/s |"
)
DBOS.destroy()
