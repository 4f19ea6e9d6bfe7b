"""Write the example workloads and SQL corpus under examples/ (deterministic).

Everything here was written for this project (schemas, questions, queries, shell
sessions); it is small on purpose: enough for the README's commands and the test
suite to run in a fresh clone, not a benchmark. The benchmark traces live in
../shared/data (see BENCHMARKS.md).

    python examples/make_examples.py            # rewrite the files
    python examples/make_examples.py --check    # exit 1 if a file differs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

SQL_SYSTEM = (
    "You are a text-to-SQL agent. Given a SQLite schema and a question, answer with "
    "exactly one SQL query and nothing else."
)

# (session, schema, [(question, query), ...]); the queries answer the questions.
SQL_SESSIONS: list[tuple[str, str, list[tuple[str, str]]]] = [
    (
        "sql-library",
        "CREATE TABLE book (id, title, author_id, year, genre, copies);\n"
        "CREATE TABLE author (id, name, country, born);\n"
        "CREATE TABLE loan (id, book_id, member_id, loaned_on, returned_on);\n"
        "CREATE TABLE member (id, name, joined, city);",
        [
            ("How many books are there?", "SELECT count(*) FROM book"),
            ("How many authors come from Norway?",
             "SELECT count(*) FROM author WHERE country = 'Norway'"),
            ("List the titles of books published after 2000, newest first.",
             "SELECT title FROM book WHERE year > 2000 ORDER BY year DESC"),
            ("What is the name of the author of the book titled 'Cold Harbour'?",
             "SELECT T2.name FROM book AS T1 JOIN author AS T2 ON T1.author_id = T2.id "
             "WHERE T1.title = 'Cold Harbour'"),
            ("How many books has each author written? Show the author name and the count.",
             "SELECT T2.name , count(*) FROM book AS T1 JOIN author AS T2 ON T1.author_id = T2.id "
             "GROUP BY T2.name"),
            ("Which members have never returned a loan? Show their names.",
             "SELECT name FROM member WHERE id IN (SELECT member_id FROM loan "
             "WHERE returned_on IS NULL)"),
            ("How many loans were made by members living in Leeds?",
             "SELECT count(*) FROM loan AS T1 JOIN member AS T2 ON T1.member_id = T2.id "
             "WHERE T2.city = 'Leeds'"),
            ("What is the average number of copies per genre?",
             "SELECT genre , avg(copies) FROM book GROUP BY genre"),
            ("List the titles of books that were never loaned.",
             "SELECT title FROM book WHERE id NOT IN (SELECT book_id FROM loan)"),
        ],
    ),
    (
        "sql-shop",
        "CREATE TABLE product (id, name, category, price, stock);\n"
        "CREATE TABLE customer (id, name, email, country);\n"
        "CREATE TABLE orders (id, customer_id, placed_on, status);\n"
        "CREATE TABLE order_item (order_id, product_id, quantity, unit_price);",
        [
            ("How many products are there?", "SELECT count(*) FROM product"),
            ("How many customers come from Canada?",
             "SELECT count(*) FROM customer WHERE country = 'Canada'"),
            ("List the names of products that cost more than 50, most expensive first.",
             "SELECT name FROM product WHERE price > 50 ORDER BY price DESC"),
            ("What is the name of the customer who placed order 1042?",
             "SELECT T2.name FROM orders AS T1 JOIN customer AS T2 ON T1.customer_id = T2.id "
             "WHERE T1.id = 1042"),
            ("How many orders has each customer placed? Show the customer name and the count.",
             "SELECT T2.name , count(*) FROM orders AS T1 JOIN customer AS T2 "
             "ON T1.customer_id = T2.id GROUP BY T2.name"),
            ("Which products are out of stock? Show their names.",
             "SELECT name FROM product WHERE stock = 0"),
            ("How many orders were shipped to customers in Canada?",
             "SELECT count(*) FROM orders AS T1 JOIN customer AS T2 ON T1.customer_id = T2.id "
             "WHERE T2.country = 'Canada' AND T1.status = 'shipped'"),
            ("What is the average price per category?",
             "SELECT category , avg(price) FROM product GROUP BY category"),
            ("List the names of products that were never ordered.",
             "SELECT name FROM product WHERE id NOT IN (SELECT product_id FROM order_item)"),
            ("What is the total revenue of order 1042?",
             "SELECT sum(quantity * unit_price) FROM order_item WHERE order_id = 1042"),
        ],
    ),
    (
        "sql-clinic",
        "CREATE TABLE patient (id, name, born, city);\n"
        "CREATE TABLE doctor (id, name, speciality, hired);\n"
        "CREATE TABLE visit (id, patient_id, doctor_id, visited_on, cost);",
        [
            ("How many doctors are there?", "SELECT count(*) FROM doctor"),
            ("How many patients live in Porto?",
             "SELECT count(*) FROM patient WHERE city = 'Porto'"),
            ("List the names of doctors hired after 2015, most recent first.",
             "SELECT name FROM doctor WHERE hired > 2015 ORDER BY hired DESC"),
            ("What is the speciality of the doctor who saw patient 'Ana Lima'?",
             "SELECT T3.speciality FROM visit AS T1 JOIN patient AS T2 ON T1.patient_id = T2.id "
             "JOIN doctor AS T3 ON T1.doctor_id = T3.id WHERE T2.name = 'Ana Lima'"),
            ("How many visits has each doctor had? Show the doctor name and the count.",
             "SELECT T2.name , count(*) FROM visit AS T1 JOIN doctor AS T2 "
             "ON T1.doctor_id = T2.id GROUP BY T2.name"),
            ("What is the average cost of a visit per speciality?",
             "SELECT T2.speciality , avg(T1.cost) FROM visit AS T1 JOIN doctor AS T2 "
             "ON T1.doctor_id = T2.id GROUP BY T2.speciality"),
            ("List the names of patients who never visited a doctor.",
             "SELECT name FROM patient WHERE id NOT IN (SELECT patient_id FROM visit)"),
            ("Which doctor had the most visits? Show the name.",
             "SELECT T2.name FROM visit AS T1 JOIN doctor AS T2 ON T1.doctor_id = T2.id "
             "GROUP BY T2.name ORDER BY count(*) DESC LIMIT 1"),
        ],
    ),
    (
        "sql-school",
        "CREATE TABLE student (id, name, grade, homeroom);\n"
        "CREATE TABLE course (id, title, teacher_id, credits);\n"
        "CREATE TABLE teacher (id, name, subject);\n"
        "CREATE TABLE enrolment (student_id, course_id, mark);",
        [
            ("How many students are there?", "SELECT count(*) FROM student"),
            ("How many students are in grade 9?",
             "SELECT count(*) FROM student WHERE grade = 9"),
            ("List the titles of courses worth more than 3 credits, largest first.",
             "SELECT title FROM course WHERE credits > 3 ORDER BY credits DESC"),
            ("What is the name of the teacher of the course titled 'Algebra I'?",
             "SELECT T2.name FROM course AS T1 JOIN teacher AS T2 ON T1.teacher_id = T2.id "
             "WHERE T1.title = 'Algebra I'"),
            ("How many courses does each teacher give? Show the teacher name and the count.",
             "SELECT T2.name , count(*) FROM course AS T1 JOIN teacher AS T2 "
             "ON T1.teacher_id = T2.id GROUP BY T2.name"),
            ("What is the average mark per course? Show the course title and the average.",
             "SELECT T2.title , avg(T1.mark) FROM enrolment AS T1 JOIN course AS T2 "
             "ON T1.course_id = T2.id GROUP BY T2.title"),
            ("List the names of students who are not enrolled in any course.",
             "SELECT name FROM student WHERE id NOT IN (SELECT student_id FROM enrolment)"),
            ("Which course has the most students? Show the title.",
             "SELECT T2.title FROM enrolment AS T1 JOIN course AS T2 ON T1.course_id = T2.id "
             "GROUP BY T2.title ORDER BY count(*) DESC LIMIT 1"),
        ],
    ),
    (
        "sql-flights",
        "CREATE TABLE airport (code, name, city, country);\n"
        "CREATE TABLE airline (id, name, country);\n"
        "CREATE TABLE flight (id, airline_id, origin, destination, departs, seats);",
        [
            ("How many airlines are there?", "SELECT count(*) FROM airline"),
            ("How many airports are in Japan?",
             "SELECT count(*) FROM airport WHERE country = 'Japan'"),
            ("List the ids of flights with more than 200 seats, largest first.",
             "SELECT id FROM flight WHERE seats > 200 ORDER BY seats DESC"),
            ("What is the name of the airline that runs flight 77?",
             "SELECT T2.name FROM flight AS T1 JOIN airline AS T2 ON T1.airline_id = T2.id "
             "WHERE T1.id = 77"),
            ("How many flights does each airline run? Show the airline name and the count.",
             "SELECT T2.name , count(*) FROM flight AS T1 JOIN airline AS T2 "
             "ON T1.airline_id = T2.id GROUP BY T2.name"),
            ("Which airports have no departing flights? Show their names.",
             "SELECT name FROM airport WHERE code NOT IN (SELECT origin FROM flight)"),
            ("How many flights leave from airports in Japan?",
             "SELECT count(*) FROM flight AS T1 JOIN airport AS T2 ON T1.origin = T2.code "
             "WHERE T2.country = 'Japan'"),
            ("What is the average number of seats per airline?",
             "SELECT T2.name , avg(T1.seats) FROM flight AS T1 JOIN airline AS T2 "
             "ON T1.airline_id = T2.id GROUP BY T2.name"),
        ],
    ),
    (
        "sql-music",
        "CREATE TABLE artist (id, name, country, formed);\n"
        "CREATE TABLE album (id, title, artist_id, released, label);\n"
        "CREATE TABLE track (id, album_id, title, seconds, plays);",
        [
            ("How many artists are there?", "SELECT count(*) FROM artist"),
            ("How many albums were released in 1999?",
             "SELECT count(*) FROM album WHERE released = 1999"),
            ("List the titles of tracks longer than 300 seconds, longest first.",
             "SELECT title FROM track WHERE seconds > 300 ORDER BY seconds DESC"),
            ("What is the name of the artist of the album titled 'Low Tide'?",
             "SELECT T2.name FROM album AS T1 JOIN artist AS T2 ON T1.artist_id = T2.id "
             "WHERE T1.title = 'Low Tide'"),
            ("How many albums has each artist released? Show the artist name and the count.",
             "SELECT T2.name , count(*) FROM album AS T1 JOIN artist AS T2 "
             "ON T1.artist_id = T2.id GROUP BY T2.name"),
            ("What is the total number of plays per album? Show the album title and the total.",
             "SELECT T2.title , sum(T1.plays) FROM track AS T1 JOIN album AS T2 "
             "ON T1.album_id = T2.id GROUP BY T2.title"),
            ("List the names of artists who have no albums.",
             "SELECT name FROM artist WHERE id NOT IN (SELECT artist_id FROM album)"),
            ("Which album has the most tracks? Show the title.",
             "SELECT T2.title FROM track AS T1 JOIN album AS T2 ON T1.album_id = T2.id "
             "GROUP BY T2.title ORDER BY count(*) DESC LIMIT 1"),
        ],
    ),
]

SHELL_SYSTEM = (
    "You are an agent that fixes bugs in a Python repository through a shell. Each reply "
    "has a THOUGHT section and exactly one bash code block with one command."
)

# (session, task, [(thought, command, tool output), ...])
SHELL_SESSIONS: list[tuple[str, str, list[tuple[str, str, str]]]] = [
    (
        "shell-slugify",
        "The function `slugify` in `textkit/slug.py` keeps trailing dashes: "
        "slugify('Hello, World!') returns 'hello-world-' instead of 'hello-world'. Fix it.",
        [
            ("I will find where `slugify` is defined.",
             "grep -rn \"def slugify\" textkit/",
             "textkit/slug.py:8:def slugify(text: str) -> str:"),
            ("I will read the function to see how it builds the slug.",
             "sed -n 1,30p textkit/slug.py",
             "import re\n\n_NON_WORD = re.compile(r\"[^a-z0-9]+\")\n\n\n"
             "def slugify(text: str) -> str:\n    text = text.lower()\n"
             "    return _NON_WORD.sub(\"-\", text)\n"),
            ("The substitution turns the trailing '!' into a dash and nothing strips it. "
             "I will strip dashes from both ends of the result.",
             "sed -i 's/    return _NON_WORD.sub(\"-\", text)/    return _NON_WORD.sub(\"-\", "
             "text).strip(\"-\")/' textkit/slug.py",
             ""),
            ("I will check the change with a quick call.",
             "python -c \"from textkit.slug import slugify; print(slugify('Hello, World!'))\"",
             "hello-world"),
            ("I will run the tests of the module.",
             "python -m pytest -q tests/test_slug.py",
             "....\n4 passed in 0.02s"),
            ("The fix works and the tests pass. I will show the diff and finish.",
             "git diff",
             "diff --git a/textkit/slug.py b/textkit/slug.py\n"
             "-    return _NON_WORD.sub(\"-\", text)\n"
             "+    return _NON_WORD.sub(\"-\", text).strip(\"-\")"),
        ],
    ),
    (
        "shell-parse-duration",
        "`parse_duration('1h30m')` in `textkit/time.py` returns 30 instead of 5400: "
        "it keeps only the last unit. Fix it.",
        [
            ("I will find where `parse_duration` is defined.",
             "grep -rn \"def parse_duration\" textkit/",
             "textkit/time.py:12:def parse_duration(text: str) -> int:"),
            ("I will read the function to see how it adds the units.",
             "sed -n 1,30p textkit/time.py",
             "import re\n\n_UNITS = {\"h\": 3600, \"m\": 60, \"s\": 1}\n"
             "_PART = re.compile(r\"(\\d+)([hms])\")\n\n\n"
             "def parse_duration(text: str) -> int:\n    total = 0\n"
             "    for number, unit in _PART.findall(text):\n"
             "        total = int(number) * _UNITS[unit]\n    return total\n"),
            ("The loop assigns each part instead of adding it. I will make it add.",
             "sed -i 's/        total = int(number) \\* _UNITS\\[unit\\]/        total += "
             "int(number) * _UNITS[unit]/' textkit/time.py",
             ""),
            ("I will check the change with a quick call.",
             "python -c \"from textkit.time import parse_duration; "
             "print(parse_duration('1h30m'))\"",
             "5400"),
            ("I will run the tests of the module.",
             "python -m pytest -q tests/test_time.py",
             "......\n6 passed in 0.03s"),
            ("The fix works and the tests pass. I will show the diff and finish.",
             "git diff",
             "diff --git a/textkit/time.py b/textkit/time.py\n"
             "-        total = int(number) * _UNITS[unit]\n"
             "+        total += int(number) * _UNITS[unit]"),
        ],
    ),
]


def sql_workload() -> str:
    lines = []
    for name, schema, turns in SQL_SESSIONS:
        messages = [{"role": "system", "content": SQL_SYSTEM}]
        for question, query in turns:
            messages.append({"role": "user",
                             "content": f"Schema:\n{schema}\n\nQuestion: {question}"})
            messages.append({"role": "assistant", "content": query})
        lines.append(json.dumps({"session": name, "source": "suffixd/examples",
                                 "messages": messages}))
    return "\n".join(lines) + "\n"


def shell_workload() -> str:
    lines = []
    for name, task, turns in SHELL_SESSIONS:
        messages = [{"role": "system", "content": SHELL_SYSTEM},
                    {"role": "user", "content": f"<task>\n{task}\n</task>"}]
        for thought, command, output in turns:
            messages.append({"role": "assistant",
                             "content": f"THOUGHT: {thought}\n\n```bash\n{command}\n```"})
            messages.append({"role": "user", "content":
                             f"<returncode>0</returncode>\n<output>\n{output}\n</output>"})
        lines.append(json.dumps({"session": name, "source": "suffixd/examples",
                                 "messages": messages[:-1]}))
    return "\n".join(lines) + "\n"


def corpus_queries() -> str:
    """Every example query once, one statement per line (the corpus's one-per-line form)."""
    seen: list[str] = []
    for _, _, turns in SQL_SESSIONS:
        for _, query in turns:
            if query not in seen:
                seen.append(query)
    return "".join(q + " ;\n" for q in seen)


# A schema file written the way people write them: several lines per statement,
# comments, a string holding a semicolon (the splitter must keep it whole).
SCHEMA_SQL = """\
-- The example shop's schema.
CREATE TABLE product (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    category TEXT NOT NULL DEFAULT 'misc; unsorted',
    price REAL NOT NULL CHECK (price >= 0),
    stock INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE customer (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT UNIQUE,
    country TEXT
);

CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customer (id),
    placed_on TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'new'  /* new, paid, shipped; or cancelled */
);

CREATE TABLE order_item (
    order_id INTEGER NOT NULL REFERENCES orders (id),
    product_id INTEGER NOT NULL REFERENCES product (id),
    quantity INTEGER NOT NULL,
    unit_price REAL NOT NULL,
    PRIMARY KEY (order_id, product_id)
);

CREATE INDEX orders_by_customer ON orders (customer_id);

CREATE VIEW order_total AS
SELECT order_id, sum(quantity * unit_price) AS total
FROM order_item
GROUP BY order_id;
"""

FILES = {
    "workloads/sql_agent.jsonl": sql_workload,
    "workloads/shell_agent.jsonl": shell_workload,
    "corpus/sql/queries.sql": corpus_queries,
    "corpus/sql/shop_schema.sql": lambda: SCHEMA_SQL,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a file differs")
    args = ap.parse_args()
    stale = []
    for rel, make in FILES.items():
        path = HERE / rel
        text = make()
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if stale:
        print("out of date (run python examples/make_examples.py):", *stale, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
