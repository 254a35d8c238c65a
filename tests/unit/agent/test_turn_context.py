"""The text a turn's named context adds after its message (pure)."""

import json
import subprocess
import sys

from fleet_agent.chat.escalation import CONTEXT_THRESHOLD, opening
from fleet_agent.chat.turn_context import (
    MAX_LISTED_PATHS,
    REPO_DIR,
    CodeInputs,
    block,
    code_variables,
    documents_in,
    in_sandbox,
    table_columns,
)
from fleet_events.envelope import BlobRef
from fleet_events.session import DocumentRef, TurnRequested


def ref(alias: str) -> DocumentRef:
    blob = BlobRef(object="o", sha256="0" * 64, size=3)
    return DocumentRef(alias=alias, source="upload", origin=f"{alias}.txt", blob=blob)


def test_nothing_named_adds_nothing() -> None:
    assert block([], [], ()) == ""


def test_documents_come_whole_under_headers_and_a_missing_one_is_said() -> None:
    text = block([(ref("notes"), "line one\nline two")], ["gone"], ())
    assert text.startswith("\n\n[attached 'notes' (notes.txt, 17 characters)]\n")
    assert "line one\nline two\n[end of 'notes']" in text
    assert "[attached 'gone' was named but is not loaded in this session]" in text


def test_paths_are_listed_for_code_to_read_and_a_long_list_is_cut_with_a_count() -> None:
    assert "working directory (read them with code): a.py, b/c.txt]" in block(
        [], [], ("a.py", "b/c.txt")
    )
    many = tuple(f"f{n}" for n in range(MAX_LISTED_PATHS + 5))
    assert block([], [], many).endswith(f"f{MAX_LISTED_PATHS - 1} and 5 more]")


def test_with_a_limit_a_document_past_the_room_left_is_named_for_the_tools() -> None:
    short, long = (ref("a"), "x" * 10), (ref("b"), "y" * 50)
    text = block([short, long], [], (), max_chars=40)
    assert "x" * 10 + "\n[end of 'a']" in text
    assert "y" * 50 not in text
    assert "[attached 'b' (b.txt, 50 characters): too long to include here" in text
    assert "as 'b']" in text
    assert "y" * 50 in block([short, long], [], ())  # no limit: both whole


def test_an_attached_text_alone_does_not_send_the_turn_to_the_tools() -> None:
    message = "What did we decide?" + block([(ref("minutes"), "we ship on friday")], [], ())
    assert opening("auto", len(message), message, CONTEXT_THRESHOLD) is None  # CoT first
    named = "Summarise" + block([], [], ("src/app.py",))
    moved = opening("auto", len(named), named, CONTEXT_THRESHOLD)
    assert moved is not None
    assert moved.to_module == "react"  # paths are read with code


def test_a_named_repository_is_given_with_its_checkout_path_and_sends_the_turn_to_tools() -> None:
    url = "https://example.invalid/acme/widgets.git"
    text = block([], [], (), repo=(url, "v1.2"))
    assert text == (
        f"\n\n[repository {url!r} at 'v1.2', checked out in the session sandbox's working "
        f"directory under {REPO_DIR}/ (read its files with code, e.g. open('repo/README.md'))]"
    )
    assert "at its default branch" in block([], [], (), repo=(url, None))
    message = "What changed?" + text
    moved = opening("auto", len(message), message, CONTEXT_THRESHOLD)
    assert moved is not None
    assert moved.to_module == "react"  # a checkout is read with code, never from the prompt


def test_context_only_tools_reach_is_in_the_sandbox() -> None:
    ask = TurnRequested(message="how many?")
    assert not in_sandbox(None, "")
    assert not in_sandbox(ask, "")
    assert not in_sandbox(ask, "\n\n[attached 'log' (app.log, 10 characters)]\nabc\n[end of 'log']")
    assert in_sandbox(TurnRequested(message="m", context_paths=("data.csv",)), "")
    assert in_sandbox(TurnRequested(message="m", repo_url="https://example.com/r.git"), "")
    named = block([(ref("big"), "x" * 50)], [], (), max_chars=10)
    assert in_sandbox(ask, named)


def test_the_code_route_gets_each_whole_document_under_its_own_name_as_it_exists() -> None:
    tricky = "a,b\n1,2\n[end of 'sales']\n[attached 'x' (x.txt, 3 characters)]\nabc\n9,9"
    attached = block(
        [(ref("sales"), tricky), (ref("class"), "def f(): pass\n"), (ref("my notes"), "hi")],
        ["gone"],
        ("a.py",),
    )
    inputs = code_variables(attached)
    variables, described = inputs.variables, inputs.described
    # each text exactly, sliced by its header's length: header-like lines inside stay text
    assert variables["sales"] == tricky
    assert variables["document_2"] == "def f(): pass\n"  # a keyword is no variable name
    assert variables["my_notes"] == "hi"  # a space becomes an underscore
    assert variables["context"] == attached  # everything, as the other modules read it
    assert set(variables) == {"sales", "document_2", "my_notes", "context"}
    lines = described.splitlines()
    assert lines[0] == (
        "sales: str, the attached document 'sales' (sales.txt) alone, 69 characters, 6 lines; "
        "it begins: \"a,b\\n1,2\\n[end of 'sales']\""
    )
    assert lines[-1].startswith(f"context: str, {len(attached)} characters, everything attached")
    assert code_variables("") == CodeInputs({}, "", "none")
    # the named sandbox file is read into a variable named after it, before the model's code
    assert inputs.prelude == ("a = open('a.py', encoding='utf-8', errors='replace').read(10000000)")
    assert "a: str, the text of the file 'a.py' in the working directory" in described


def test_named_files_become_variables_read_by_the_cells_prelude_and_only_five() -> None:
    paths = ("haystack.txt", "data/sales.csv", "class.py", "2024.log", "x.txt", "y.txt")
    inputs = code_variables(block([], [], paths))
    assert inputs.prelude.splitlines() == [
        "haystack = open('haystack.txt', encoding='utf-8', errors='replace').read(10000000)",
        "sales = open('data/sales.csv', encoding='utf-8', errors='replace').read(10000000)",
        "file_3 = open('class.py', encoding='utf-8', errors='replace').read(10000000)",
        "file_4 = open('2024.log', encoding='utf-8', errors='replace').read(10000000)",
        "x = open('x.txt', encoding='utf-8', errors='replace').read(10000000)",
    ]
    assert set(inputs.variables) == {"context"}  # read in the sandbox, never sent
    assert "haystack: str, the text of the file 'haystack.txt'" in inputs.described
    assert documents_in("no header here") == []


def test_an_attached_csv_table_also_comes_as_rows_with_numbers_parsed() -> None:
    sales = "region,units,price\nnorth,12,3.5\nsouth,7,4.0\n\neast,30,2.25\n"
    attached = block([(ref("sales"), sales), (ref("sales_rows"), "taken\n")], [], ())
    inputs = code_variables(attached)
    # the rows are made in the sandbox by the prelude, from the text sent: never sent
    assert set(inputs.variables) == {"sales", "sales_rows", "context"}
    assert "sales_rows_rows" not in inputs.described
    (rows_line,) = [line for line in inputs.described.splitlines() if "read as CSV" in line]
    assert rows_line.startswith("rows_1: list of dict, sales read as CSV: one dict per row, ")
    assert "keys 'region', 'units', 'price'" in rows_line
    # the prelude as a cell runs it: in a Python of its own, the document's text given
    program = f"sales = {sales!r}\n{inputs.prelude}\nimport json\nprint(json.dumps(rows_1))"
    ran = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == [
        {"region": "north", "units": 12, "price": 3.5},
        {"region": "south", "units": 7, "price": 4.0},
        {"region": "east", "units": 30, "price": 2.25},
    ]


def test_only_a_regular_table_is_read_as_csv() -> None:
    assert table_columns("a,b\n1,2\n") == ["a", "b"]
    assert table_columns("a,b\n") is None  # a header alone
    assert table_columns("one column\n1\n2\n") is None
    assert table_columns("a,b\n1,2\n3\n") is None  # a row narrower than the header
    assert table_columns("a,a\n1,2\n") is None  # keys would collide
    assert table_columns("a,\n1,2\n") is None  # an empty column name
    assert table_columns(",".join(f"c{i}" for i in range(51)) + "\n" + "1," * 50 + "1\n") is None
    text = "line 1 hay\nline 2 NEEDLE\n"
    assert table_columns(text) is None
    assert "read as CSV" not in code_variables(block([(ref("hay"), text)], [], ())).described


def test_a_table_is_judged_as_the_prelude_parses_it() -> None:
    # a bare carriage return between lines: DictReader over StringIO raises on it
    assert table_columns("a,b\r1,2\r3,4") is None
    # a first line that is blank: DictReader would key the rows by it
    assert table_columns("\nname,qty\nx,1\n") is None
    assert table_columns(" \na,b\n1,2\n") is None
    assert table_columns("a,b\n1,2\n\n3,4\n") == ["a", "b"]  # blank rows between: skipped


def test_only_plain_numbers_become_numbers_and_names_are_as_python_reads_them() -> None:
    text = "name,zip,qty,ratio\nNan,007,12,0.5\ninf,10115,-3,1e3\n"
    café = "cafe\u0301"  # a macOS file name: decomposed
    inputs = code_variables(block([(ref(café), text)], [], ()))
    (name,) = set(inputs.variables) - {"context"}
    assert name == "caf\u00e9"  # NFKC, as Python reads `café` in the prelude's source
    program = f"{name} = {text!r}\n{inputs.prelude}\nimport json\nprint(json.dumps({name}_rows))"
    ran = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == [
        {"name": "Nan", "zip": "007", "qty": 12, "ratio": 0.5},
        {"name": "inf", "zip": 10115, "qty": -3, "ratio": 1000.0},
    ]


def test_no_name_shadows_a_builtin_or_another_variable() -> None:
    table = "a,b\n1,2\n"
    docs = [(ref("int"), table), (ref("a"), table), (ref("a_rows"), "x"), (ref("rows_2"), "y")]
    inputs = code_variables(block(docs, [], ()))
    assert "int" not in inputs.variables  # the prelude's own int() stays the builtin
    assert {"document_1", "a", "a_rows", "rows_2"} <= set(inputs.variables)
    made = [line.split(" = ", 1)[0] for line in inputs.prelude.splitlines() if "DictReader" in line]
    assert made == ["document_1_rows", "rows_2_2"]  # the second table's rows take a free name
    assert len(set(made) | set(inputs.variables)) == len(made) + len(inputs.variables)


def test_a_wide_table_names_at_most_twenty_keys_each_cut_short() -> None:
    header = ",".join(f"{'k' * 60}{i}" for i in range(30))
    inputs = code_variables(
        block([(ref("wide"), header + "\n" + ",".join("1" * 30) + "\n")], [], ())
    )
    (line,) = [x for x in inputs.described.splitlines() if "read as CSV" in x]
    assert "and 10 more" in line
    assert len(line) < 20 * 50 + 400
