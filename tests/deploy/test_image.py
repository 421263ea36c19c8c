"""deploy/Dockerfile installs Tide with the Makefile's install steps, from the sources it
copies, and its entrypoint runs each service.

No Docker engine here: the install steps are compared with the Makefile's, then the same
sources (the Dockerfile's COPY list) are built into a wheel offline and installed into a
fresh venv whose only other packages are the dev venv's dependencies; the image's
entrypoint script runs the services from it. The Dockerfile's steps are also run as they
are (an online ``pip install`` into a fresh venv: about 8 s with a warm pip cache, 16 s
without).
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import shlex
import shutil
import site
import subprocess
import sys
from pathlib import Path

from tests.deploy._manifests import (
    DEPLOY,
    ENTRYPOINT,
    ROOT,
    SERVICES,
    dockerfile_entrypoint,
    dockerfile_stages,
)

MAKEFILE = ROOT / "Makefile"
# Flags that change output or caching, not what is installed.
QUIET_FLAGS = {"--quiet", "-q", "--no-cache-dir"}


def normalize(command: list[str], venv: str, python: str) -> list[str]:
    """One install command in a form both files share: the venv path as VENV, its python
    as VENV/bin/python, the base python as PYTHON, the project as '.'. The editable flag
    and the dev extra are what a development checkout adds; the image has neither."""
    names = {
        python: "PYTHON",
        f"{venv}/bin/python": "VENV/bin/python",
        venv: "VENV",
        ".[dev]": ".",
        "./": ".",
    }
    return [names.get(word, word) for word in command if word not in QUIET_FLAGS | {"-e"}]


def makefile_steps() -> list[list[str]]:
    """The recipe that installs the venv (the target touching $(STAMP))."""
    lines = MAKEFILE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("$(STAMP): ")) + 1
    steps = []
    for line in lines[start:]:
        if not line.startswith("\t"):
            break
        words = shlex.split(line.strip())
        if words[0] != "touch":
            steps.append(
                normalize(
                    [w.replace("$(PY)", "$(VENV)/bin/python") for w in words],
                    "$(VENV)",
                    "$(PYTHON)",
                )
            )
    return steps


def dockerfile_build_stage() -> tuple[list[list[str]], list[str], str]:
    """(install steps, copied sources, workdir) of the stage that installs the project."""
    [stage] = [s for s in dockerfile_stages() if any("pip install" in r for _, r in s.instructions)]
    workdir = next(rest for word, rest in stage.instructions if word == "WORKDIR")
    sources = [
        source
        for word, rest in stage.instructions
        if word == "COPY" and not rest.startswith("--from")
        for source in shlex.split(rest)[:-1]
    ]
    [run] = [rest for word, rest in stage.instructions if word == "RUN" and "pip install" in rest]
    commands = [shlex.split(part) for part in run.split("&&")]
    venv = commands[0][-1]
    return [normalize(c, venv, "python") for c in commands], sources, workdir


def test_dockerfile_installs_with_the_makefile_steps() -> None:
    steps, _, _ = dockerfile_build_stage()
    assert steps == makefile_steps()
    assert steps == [
        ["PYTHON", "-m", "venv", "VENV"],
        ["VENV/bin/python", "-m", "pip", "install", "--upgrade", "pip"],
        ["VENV/bin/python", "-m", "pip", "install", "."],
    ]


def test_image_runs_as_non_root_with_one_entrypoint_for_every_service() -> None:
    final = dockerfile_stages()[-1]
    assert final.base.startswith("python:") and "slim" in final.base
    users = [rest for word, rest in final.instructions if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert dockerfile_entrypoint() == [ENTRYPOINT]
    copies = [rest for word, rest in final.instructions if word == "COPY"]
    assert any(f"deploy/{ENTRYPOINT}" in rest for rest in copies)


def dockerignore_excludes(path: str) -> bool:
    """Docker's rule: the last pattern that matches decides ('!' re-includes)."""
    excluded = False
    for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(
            fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, pattern.replace("**/", ""))
            for p in prefixes
        ):
            excluded = not negate
    return excluded


def test_dockerignore_keeps_what_the_dockerfile_copies_and_nothing_else() -> None:
    _, sources, _ = dockerfile_build_stage()
    final_copies = [
        shlex.split(rest)[0]
        for word, rest in dockerfile_stages()[-1].instructions
        if word == "COPY" and not rest.startswith("--from")
    ]
    for source in [*sources, *final_copies]:
        assert not dockerignore_excludes(source), f"{source} is copied but ignored"
    for private in (".venv", ".git", ".tide", "tests", "bench", "tide/__pycache__"):
        assert dockerignore_excludes(private), f"{private} would be sent to the builder"


def run(
    args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=120, check=False, cwd=cwd, env=env
    )


def test_image_sources_install_and_run_every_service(tmp_path: Path) -> None:
    # The build context as the Dockerfile copies it.
    _, sources, _ = dockerfile_build_stage()
    src = tmp_path / "src"
    src.mkdir()
    for source in sources:
        origin = ROOT / source
        if origin.is_dir():
            shutil.copytree(origin, src / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, src / source)
    wheels = tmp_path / "wheels"
    # Offline with the venv's setuptools (pyproject's build backend); else pip fetches it.
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    built = run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            *isolation,
            "--wheel-dir",
            str(wheels),
            str(src),
        ]
    )
    assert built.returncode == 0, built.stderr
    [wheel] = wheels.glob("tide-*.whl")
    # A fresh venv; the dependencies come from the dev venv's site-packages (a plain path:
    # the editable install's hook there is not loaded), Tide itself only from the wheel.
    venv = tmp_path / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ]
    )
    assert installed.returncode == 0, installed.stderr
    [site_dir] = (venv / "lib").glob("python3*/site-packages")
    (site_dir / "zz_dev_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path)}
    where = run(
        [str(python), "-c", "import services, tide; print(services.__file__, tide.__file__)"],
        cwd=tmp_path,
        env=env,
    )
    assert where.returncode == 0, where.stderr
    assert all(p.startswith(str(venv)) for p in where.stdout.split()), where.stdout
    entrypoint = str(DEPLOY / ENTRYPOINT)
    for service in SERVICES:
        helped = run(["sh", entrypoint, service, "--help"], cwd=tmp_path, env=env)
        assert helped.returncode == 0, helped.stderr
        assert f"tide-{service}" in helped.stdout and "--listen" in helped.stdout
    assert (venv / "bin" / "tide").exists(), "the tide console script"
    # The web console, with its templates and assets from the wheel (package-data).
    helped = run(["sh", entrypoint, "console", "--help"], cwd=tmp_path, env=env)
    assert helped.returncode == 0, helped.stderr
    assert "tide console" in helped.stdout and "--session-key-file" in helped.stdout
    for asset in ("templates/base.html", "static/console.css"):
        assert (site_dir / "services" / "console" / asset).is_file(), asset
    unknown = run(["sh", entrypoint, "broker"], cwd=tmp_path, env=env)
    assert unknown.returncode == 2 and "unknown service" in unknown.stderr


def test_dockerfile_steps_install_in_a_fresh_venv(tmp_path: Path) -> None:
    steps, sources, _ = dockerfile_build_stage()
    src = tmp_path / "src"
    src.mkdir()
    for source in sources:
        origin = ROOT / source
        if origin.is_dir():
            shutil.copytree(origin, src / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, src / source)
    venv = tmp_path / "venv"
    values = {"PYTHON": sys.executable, "VENV": str(venv), "VENV/bin/python": f"{venv}/bin/python"}
    for step in steps:
        done = run([values.get(word, word) for word in step], cwd=src)
        assert done.returncode == 0, done.stderr
    helped = run([f"{venv}/bin/python", "-m", "services.storage", "--help"], cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
