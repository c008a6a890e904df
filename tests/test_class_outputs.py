"""What grade-class writes for a whole class: totals against the whole assignment,
canvas.csv, the similarity report, and shards that merge into one run's gradebook."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from test_grader import _instructor, _meta, _notebook

from course_utils.instructor.canvas import POINTS_POSSIBLE, parse_columns, write_canvas
from course_utils.instructor.gradebook import write_gradebook
from course_utils.instructor.shards import parse_shard, share
from course_utils.instructor.similarity import similar_pairs
from course_utils.instructor.student import InputError, student_version, write_notebook
from course_utils.tooling.cli import main

# An exercise long enough to copy: an AMP training step (the instructor's solution).
STEP = """def train_step(model, batch, optimizer, scaler):
    ### BEGIN SOLUTION
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
    ### END SOLUTION"""
# Two learners' own answers, then a copy of the first with every name changed, comments
# added and the layout changed.
OWN_A = """def train_step(model, batch, optimizer, scaler):
    inputs, labels = batch
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        outputs = model(inputs)
        loss = torch.nn.functional.cross_entropy(outputs, labels, label_smoothing=0.1)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    history.append(float(loss))
    return loss.detach()"""
COPY_OF_A = """def train_step(net, data, opt, sc):
    # my own work, honestly
    xs, ys = data
    with torch.autocast(device_type = "cuda", dtype = torch.float16):
        outs = net(xs)
        l = torch.nn.functional.cross_entropy(outs, ys, label_smoothing = 0.1)
    opt.zero_grad()
    sc.scale(l).backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    sc.step(opt)
    sc.update()
    history.append(float(l))
    return l.detach()"""
OWN_B = """def train_step(m, b, o, s):
    inp, tgt = b
    with torch.autocast(device_type='cuda', dtype=torch.half):
        pred = m(inp)
        err = nn.CrossEntropyLoss()(pred, tgt)
    o.zero_grad(set_to_none=True)
    s.scale(err).backward()
    s.step(o); s.update()
    return err.detach()"""
# A small exercise: independent right answers look alike by necessity.
MOVE = (
    "def move(batch, device):\n    ### BEGIN SOLUTION\n"
    "    return [t.to(device, non_blocking=t.is_pinned()) for t in batch]\n"
    "    ### END SOLUTION"
)
MOVES = [
    "def move(batch, device):\n"
    "    return [x.to(device, non_blocking=x.is_pinned()) for x in batch]",
    "def move(batch, device):\n    out = []\n    for t in batch:\n"
    "        out.append(t.to(device, non_blocking=t.is_pinned()))\n    return out",
    "def move(b, d):\n"
    "    return [v.to(d, non_blocking=True) if v.is_pinned() else v.to(d) for v in b]",
    "def move(batch, device):\n    return [tensor.to(device, non_blocking=tensor.is_pinned()) "
    "for tensor in batch]",
]
GIVEN = {
    "nb.ipynb": {
        "step": STEP + "\n" + "def train_step(model, batch, optimizer, scaler):",
        "move": MOVE,
    }
}


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as handle:
        return list(csv.reader(handle))


def test_a_copied_answer_with_renamed_names_is_found_independent_ones_are_not():
    answers = {
        "ann": {"nb.ipynb": {"step": OWN_A, "move": MOVES[0]}},
        "ben": {"nb.ipynb": {"step": COPY_OF_A, "move": MOVES[1]}},
        "cat": {"nb.ipynb": {"step": OWN_B, "move": MOVES[2]}},
        "dan": {"nb.ipynb": {"step": STEP.replace("### ", "# "), "move": MOVES[3]}},
    }
    pairs = similar_pairs(answers, GIVEN)
    assert [(p.exercise, p.learner_a, p.learner_b) for p in pairs] == [("step", "ann", "ben")]
    assert pairs[0].similarity > 0.9
    assert "clip_grad_norm_" in pairs[0].shared_lines and "history.append" in pairs[0].shared_lines
    # The instructor's own solution is boilerplate: handing it in twice is no copy.
    twice = {"x": {"nb.ipynb": {"step": STEP}}, "y": {"nb.ipynb": {"step": STEP}}}
    assert similar_pairs(twice, GIVEN) == []
    # Without the boilerplate, the same two answers are alike.
    assert len(similar_pairs(twice, {})) == 1


def test_missing_notebooks_score_zero_against_the_whole_assignment(tmp_path):
    report = {"score": 3.0, "max_score": 3.0, "matched": [], "checks": []}
    results = [{"learner": "ann", "notebook": f"0{n}.ipynb", "report": report} for n in (1, 2)]
    results.append({"learner": "ben", "notebook": "01.ipynb", "report": report})
    notebooks = ["01.ipynb", "02.ipynb", "03.ipynb"]
    maxima = dict.fromkeys(notebooks, 3.0)
    book, _ = write_gradebook(tmp_path, ["ann", "ben"], notebooks, results, {}, maxima)
    rows = {row[0]: row for row in _rows(book)[1:]}
    header = _rows(book)[0]
    at = {name: header.index(name) for name in ("total", "max", "missing")}
    assert [rows["ann"][at[k]] for k in at] == ["6", "9", "03.ipynb"]
    assert [rows["ben"][at[k]] for k in at] == ["3", "9", "02.ipynb 03.ipynb"]


def test_canvas_csv_columns_and_roster(tmp_path):
    scores = {("ann", "01_x.ipynb"): 2.0, ("ben", "01_x.ipynb"): 0.5}
    path = write_canvas(tmp_path, ["ann", "ben"], ["01_x.ipynb"], scores, {"01_x.ipynb": 3.0})
    rows = _rows(path)
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "01_x"]
    assert rows[1] == [POINTS_POSSIBLE, "", "", "", "", "3"]
    assert rows[2] == ["ann", "", "", "ann", "", "2"] and rows[3][-1] == "0.5"
    roster = tmp_path / "export.csv"
    roster.write_text(
        "Student,ID,SIS User ID,SIS Login ID,Section,01_x (4417)\n"
        f"{POINTS_POSSIBLE},,,,,3\n"
        '"Lee, Ann",101,s-1,ann,Lab A,\n'
    )
    path = write_canvas(tmp_path, ["ann"], ["01_x.ipynb"], scores, {"01_x.ipynb": 3.0}, roster)
    rows = _rows(path)
    assert rows[0][-1] == "01_x (4417)"  # the roster's assignment is updated, not a new one
    assert rows[2] == ["Lee, Ann", "101", "s-1", "ann", "Lab A", "2"]
    # A learner the roster lacks: one line naming them, and no canvas.csv left behind
    # (not even the one written above: it would be imported as if current).
    with pytest.raises(InputError, match=r"no student named ben \(no canvas.csv written\)"):
        write_canvas(tmp_path, ["ann", "ben"], ["01_x.ipynb"], scores, {"01_x.ipynb": 3.0}, roster)
    assert not (tmp_path / "canvas.csv").exists()
    assert not list(tmp_path.glob("*.partial"))


def test_canvas_columns_map_several_notebooks_into_one_assignment(tmp_path):
    roster = tmp_path / "export.csv"
    roster.write_text(
        "Student,ID,SIS User ID,SIS Login ID,Section,Lab 1: runtime and devices (5501),"
        "Quiz (77)\n"
        '"Lee, Ann",101,s-1,ann,Lab A,,\n'
        '"Roe, Bob",102,s-2,bob,Lab A,,\n'
    )
    notebooks = ["01_a.ipynb", "02_b.ipynb", "03_c.ipynb"]
    scores = {
        ("ann", "01_a.ipynb"): 2.0,
        ("ann", "02_b.ipynb"): 1.5,
        ("ann", "03_c.ipynb"): 1,
        ("bob", "01_a.ipynb"): 3.0,
    }
    maxima = {"01_a.ipynb": 3.0, "02_b.ipynb": 2.0, "03_c.ipynb": 1.0}
    columns = parse_columns(
        ["01_a=5501", "02_b.ipynb=Lab 1: runtime and devices (5501)", "03_c=Bonus"]
    )
    # bob handed in a notebook that matched nothing: his Lab 1 cell is left empty, not 0.
    path = write_canvas(
        tmp_path,
        ["ann", "bob"],
        notebooks,
        scores,
        maxima,
        roster,
        columns=columns,
        pending={("bob", "02_b.ipynb")},
    )
    rows = _rows(path)
    assert rows[0][5:] == ["Lab 1: runtime and devices (5501)", "Bonus"]
    assert rows[1][5:] == ["5", "1"]
    assert rows[2][5:] == ["3.5", "1"]
    assert rows[3][5:] == ["", "0"]
    for bad, message in (
        (["01_a=9999"], "no assignment 9999"),
        (["04_d=X"], "not a notebook"),
        (["01_a"], "NOTEBOOK=COLUMN"),
    ):
        with pytest.raises(InputError, match=message):
            write_canvas(
                tmp_path, ["ann"], notebooks, scores, maxima, roster, columns=parse_columns(bad)
            )


def test_shards_deal_every_learner_once():
    learners = [f"l{n:02d}" for n in range(11)]
    shares = [share(learners, (k, 4)) for k in range(1, 5)]
    assert sorted(learner for part in shares for learner in part) == learners
    assert shares == [share(list(reversed(learners)), (k, 4)) for k in range(1, 5)]
    assert parse_shard("2/4") == (2, 4)
    for bad in ("0/4", "5/4", "x", "1/2/3", "2"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)


def _two_exercises() -> object:
    notebook = _instructor()
    notebook.cells += _notebook(
        [
            ("code", "import torch\nimport torch.nn.functional as F", {}),
            ("code", STEP, _meta("t-step", solution=True)),
            (
                "code",
                "check(callable(train_step), 'train_step should be a function')\npassed('step')",
                _meta("t-step-check", solution=False),
            ),
        ]
    ).cells
    return notebook


@pytest.fixture
def klass(tmp_path: Path) -> tuple[Path, Path]:
    """Two instructor notebooks; ann hands in both (ben copies her step), the rest one."""
    source = tmp_path / "instructor"
    write_notebook(_two_exercises(), source / "01_ex.ipynb")
    write_notebook(_instructor(), source / "02_ex.ipynb")
    submissions = tmp_path / "class"
    for learner, step in (("ann", OWN_A), ("ben", COPY_OF_A), ("cat", OWN_B)):
        notebook = _two_exercises()
        notebook.cells[-2].source = step
        write_notebook(notebook, submissions / learner / "01_ex.ipynb")
    write_notebook(student_version(_instructor()), submissions / "ann" / "02_ex.ipynb")
    return source, submissions


@pytest.mark.slow
def test_sharded_grading_then_merge_equals_one_run(klass, tmp_path, capsys):
    source, submissions = klass
    common = ["--source", str(source), "--jobs", "2", "--sandbox", "none"]
    assert main(["grade-class", str(submissions), "--out", str(tmp_path / "one"), *common]) == 0
    shards = [tmp_path / f"shard{k}" for k in (1, 2)]
    for k, folder in enumerate(shards, 1):
        args = ["grade-class", str(submissions), "--out", str(folder), "--shard", f"{k}/2"]
        assert main([*args, *common]) == 0
    assert main(["grade-merge", *map(str, reversed(shards)), "--out", str(tmp_path / "all")]) == 0
    capsys.readouterr()
    for name in ("gradebook.csv", "checks.csv", "canvas.csv", "similarity.csv"):
        one, merged = (tmp_path / "one" / name).read_text(), (tmp_path / "all" / name).read_text()
        assert merged == one, name
    book = {row[0]: row for row in _rows(tmp_path / "one" / "gradebook.csv")}
    assert book["learner"][1:6] == ["01_ex.ipynb", "02_ex.ipynb", "total", "max", "missing"]
    assert book["ben"][3:6] == ["4", "7", "02_ex.ipynb"]  # 01: 4 of 4; 02 (3 points) missing
    assert book["ann"][3:6] == ["4", "7", ""]  # 02 handed in unsolved
    similar = _rows(tmp_path / "one" / "similarity.csv")
    rows = [(r[1], r[2], r[3]) for r in similar[1:]]
    # ben copied ann's step (that answer and all their own code alike); everyone handed in
    # 01's first two exercises as the published solution (the fixture's notebooks).
    published = [(gid, who, "(published solution)") for gid in ("t-double", "t-greet")
                 for who in ("ann", "ben", "cat")]  # fmt: skip
    assert sorted(rows) == sorted(
        [("t-step", "ann", "ben"), ("(all own code)", "ann", "ben"), *published]
    ), rows
    assert (tmp_path / "all" / "feedback" / "cat" / "01_ex.ipynb").is_file()
    assert (tmp_path / "one" / "similarity.html").read_text().count("<tr>") == 1 + len(rows)


def test_merge_refuses_an_incomplete_set_of_shards(klass, tmp_path, capsys):
    for k in (1, 3):
        folder = tmp_path / f"s{k}"
        folder.mkdir()
        (folder / "run.json").write_text(
            '{"learners": [], "assignment": [], "maxima": {}, "notes": {}, "tasks": [], '
            f'"answers": {{}}, "given": {{}}, "shard": [{k}, 3]}}'
        )
    assert (
        main(
            [
                "grade-merge",
                str(tmp_path / "s1"),
                str(tmp_path / "s3"),
                "--out",
                str(tmp_path / "m"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    expected = "error: grade-merge needs each of the 3 shards once: missing shard(s) [2]"
    assert err.startswith(expected)
    assert len(err.strip().splitlines()) == 1
    assert main(["grade-merge", str(tmp_path), "--out", str(tmp_path / "m")]) == 2
    assert "no run.json" in capsys.readouterr().err
    assert main(["grade-class", "x", "--shard", "3/2"]) == 2
    assert "K must be between 1 and N" in capsys.readouterr().err
