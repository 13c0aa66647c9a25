"""#K8S directives come from the script's leading comments only, like #SBATCH; errors name the line."""

from __future__ import annotations

import pytest

from bridge.core.directives import DirectiveError, Directives, interpreter_of, parse_directives


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("#!/bin/sh\necho hi\n", Directives()),
        ("#!/bin/sh\n#K8S image=debian:12\n", Directives(image="debian:12")),
        (
            "#!/bin/bash\n#SBATCH -N 2\n\n# a comment\n#K8S image=python:3.12 pull_policy=Always\n"
            "#K8S workdir=/work shm_size=8Gi\necho run\n",
            Directives(image="python:3.12", pull_policy="Always", workdir="/work", shm_size="8Gi"),
        ),
        # After the first command, directives are ignored (as sbatch ignores late #SBATCH lines).
        ("#!/bin/sh\n#K8S image=a\necho x\n#K8S image=b\n#K8S bogus\n", Directives(image="a")),
        # Only `#K8S` at the start of a line is a directive.
        ("#!/bin/sh\n  #K8S image=a\n#k8s image=b\n#K8Simage=c\n", Directives()),
        # Quotes and trailing comments work as in a shell.
        ('#!/bin/sh\n#K8S image="reg.io/x:1"  # pinned\n', Directives(image="reg.io/x:1")),
        ("#!/bin/sh\r\n#K8S image=a\r\necho\r\n", Directives(image="a")),
        ("#K8S image=noshebang\n", Directives(image="noshebang")),
        ("#!/bin/sh\n#K8S\timage=tab\n", Directives(image="tab")),
        ("#!/bin/sh\n#K8S shm_size=512Mi\n", Directives(shm_size="512Mi")),
    ],
)
def test_parse_directives(script: str, expected: Directives) -> None:
    assert parse_directives(script) == expected


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("#!/bin/sh\n#K8S color=blue\n", "line 2: unknown key 'color'; allowed keys: image, pull_policy"),
        ("#!/bin/sh\n#SBATCH -n1\n#K8S image\n", "line 3: expected key=value, got 'image'"),
        ("#!/bin/sh\n#K8S\n", "line 2: #K8S without key=value"),
        ("#!/bin/sh\n#K8S image=\n", "line 2: image needs a value"),
        ("#!/bin/sh\n#K8S pull_policy=always\n", "line 2: pull_policy must be one of Always, IfNotPresent"),
        ("#!/bin/sh\n#K8S workdir=rel\n", "line 2: workdir must be an absolute path"),
        ("#!/bin/sh\n#K8S shm_size=lots\n", "line 2: shm_size must be a size"),
        ("#!/bin/sh\n#K8S shm_size=0Gi\n", "line 2: shm_size must be a size"),
        ("#!/bin/sh\n#K8S image='a\n", "line 2: No closing quotation"),
        ("#!/bin/sh\n#K8S image=a\n\n#K8S image=b\n", "line 4: image already given on line 2"),
        ("#!/bin/sh\n#K8S image='a b'\n", "line 2: image 'a b' contains whitespace"),
    ],
)
def test_parse_directives_rejects_mistakes(script: str, message: str) -> None:
    with pytest.raises(DirectiveError) as info:
        parse_directives(script)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("script", "command"),
    [
        ("#!/bin/bash\necho\n", ("/bin/bash",)),
        ("#!/bin/bash -l\n", ("/bin/bash", "-l")),
        ("#! /usr/bin/env python3\n", ("/usr/bin/env", "python3")),
        # Linux passes the rest of the line as ONE argument.
        ("#!/usr/bin/env -S bash -e\n", ("/usr/bin/env", "-S bash -e")),
        ("#!/bin/sh\r\n", ("/bin/sh",)),
        ("echo no shebang\n", ("/bin/sh",)),
        ("#!\n", ("/bin/sh",)),
        ("", ("/bin/sh",)),
    ],
)
def test_interpreter_of_follows_the_shebang(script: str, command: tuple[str, ...]) -> None:
    assert interpreter_of(script) == command
