"""scripts/fresh_machine.sh over a made-up repository: it runs the README's two commands in a new clone, in the
README's order, not in the source checkout; a README without either command, a failing command, or a `make run` that
renders nothing fails the check."""
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fresh_machine.sh"
README = """# made up

## Two commands

```bash
make run    # renders
make test   # tests
make lab    # not run by the check
```
"""
MAKEFILE = """run:
\tmkdir -p outputs/cpu/now && touch outputs/cpu/now/attention_lab.html
\techo run $$PWD >> "$(LOG)"
test:
\techo test $$PWD $${PYTHONPATH:-unset} >> "$(LOG)"
\t$(FAIL_TEST)
lab:
\techo lab >> "$(LOG)"
test-system:
\techo test-system $$PWD >> "$(LOG)"
"""


def made_up(tmp_path, readme=README, makefile=MAKEFILE) -> Path:
    """A repository with the README, the Makefile and a committed render of record, as outputs/ holds them."""
    repo = tmp_path / "source"
    (repo / "outputs" / "gpu" / "of-record").mkdir(parents=True)
    (repo / "outputs" / "gpu" / "of-record" / "attention_lab.html").write_text("<html></html>")
    (repo / "README.md").write_text(readme)
    (repo / "Makefile").write_text(makefile)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "made up"], check=True)
    return repo


def check(tmp_path, repo, *then, **env):
    log = tmp_path / "make.log"
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path), "LOG": str(log),
               "PYTHONPATH": "/somewhere/else", **env}
    extra = [word for command in then for word in ("--then", command)]
    result = subprocess.run(["bash", str(SCRIPT), str(repo), *extra], capture_output=True, text=True, env=environ)
    return result, log.read_text().splitlines() if log.exists() else []


def test_the_readme_commands_run_in_a_new_clone_in_order(tmp_path):
    repo = made_up(tmp_path)
    result, lines = check(tmp_path, repo)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split()[0] for line in lines] == ["run", "test"]  # make lab is not part of the check
    clone = Path(lines[0].split()[1])
    assert clone != repo and clone.name == "repo" and clone.parent.name.startswith("attnlab-fresh.")
    assert lines[1].split()[1:] == [str(clone), "unset"]  # the caller's PYTHONPATH does not leak in
    assert "make run rendered outputs/cpu/now/attention_lab.html" in result.stdout
    assert result.stdout.rstrip().endswith("fresh-machine check passed")


def test_a_then_command_runs_in_the_clone_after_the_readme_commands_only_when_they_pass(tmp_path):
    repo = made_up(tmp_path)
    result, lines = check(tmp_path, repo, "make test-system")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split()[0] for line in lines] == ["run", "test", "test-system"]
    assert lines[2].split()[1] == lines[0].split()[1]  # in the same clone
    (tmp_path / "make.log").unlink()
    result, lines = check(tmp_path, repo, "make test-system", FAIL_TEST="false")
    assert result.returncode != 0 and [line.split()[0] for line in lines] == ["run", "test"]


def test_a_readme_without_a_command_fails(tmp_path):
    repo = made_up(tmp_path, readme=README.replace("make test   # tests\n", ""))
    result, lines = check(tmp_path, repo)
    assert result.returncode != 0 and lines == []
    assert "README's Two commands block lacks 'make test'" in result.stdout


def test_a_failing_command_fails_the_check(tmp_path):
    repo = made_up(tmp_path)
    result, lines = check(tmp_path, repo, FAIL_TEST="false")
    assert result.returncode != 0
    assert "fresh-machine check passed" not in result.stdout


def test_a_run_that_renders_nothing_fails_though_a_committed_render_is_there(tmp_path):
    repo = made_up(tmp_path, makefile=MAKEFILE.replace(
        "\tmkdir -p outputs/cpu/now && touch outputs/cpu/now/attention_lab.html\n", ""))
    result, _ = check(tmp_path, repo)
    assert result.returncode != 0
    assert "make run left no rendered walkthrough" in result.stdout
