"""A wheelhouse: every wheel the project needs beyond a host's own torch, in one
directory small enough to carry onto a host with no package index (docs/launching.md,
"Installing offline").

    python scripts/wheelhouse.py build --stack torch2.11 --device cuda --cuda-variant cu130 \\
        --gpu-arch sm_90 --python-version 3.12 --output DIR
    python scripts/wheelhouse.py show DIR FIELD     # what scripts/install.sh reads

``build`` downloads, for the target's Python and manylinux x86_64 (not this host's):
the stack's FBGEMM (the CUDA build trimmed to ``--gpu-arch`` by
scripts/trim_fbgemm_wheel.py, its digest checked against the stack's
``trimmed-wheels`` pins), its torchrec, and the runtime packages of requirements.txt
that training, evaluation, export and the GPU check import (`WHEELHOUSE_PACKAGES`),
with their dependencies, except torch and torch's own: the resolver is handed a
stand-in torch wheel of the host's version (metadata only), so nothing pulls torch's
gigabytes in. A requirement published only as a source archive is built here into a
wheel, which must then be pure Python. DIR gets ``wheels.tar.xz`` (the wheels,
xz-compressed together) and ``wheelhouse.json`` (the stack, the target, the pins and
the archive's digest); the build fails with one line when DIR exceeds ``--max-mib``.
"""

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import asdict, dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.cli import OneLineParser
from common.json_fields import TEXT, FileFieldError, JsonObject, text_list
from scripts.trim_fbgemm_wheel import TrimError, sha256_of, trim_wheel

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEELHOUSE_VERSION = 1
MANIFEST = "wheelhouse.json"
ARCHIVE = "wheels.tar.xz"
# What a training host imports from requirements.txt (torchrec's runtime needs, numpy,
# YAML configs). Not carried, to stay within 60 MiB: Parquet (pyarrow, 53 MB), charts
# (matplotlib with pillow and fonttools, 24 MB: plan and report PNGs), TensorBoard,
# serving (uvicorn, h11, click), launching (torchx, kubernetes).
WHEELHOUSE_PACKAGES = ("torchmetrics", "tensordict", "pyre-extensions", "tqdm", "iopath", "numpy", "PyYAML")
# The editable install of the project itself (pyproject.toml's build backend) on a host
# with no index: pip builds it without isolation, with this setuptools.
BUILD_REQUIREMENT = "setuptools>=64"
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")


class WheelhouseError(Exception):
    """One line for the user."""


@dataclass
class Wheelhouse:
    """wheelhouse.json: what the archive holds and for which host."""

    version: int
    stack: str
    device: str  # cpu or cuda
    cuda_variant: str  # "" on cpu
    gpu_arch: str  # "" when FBGEMM is not trimmed
    python: str  # "3.12"
    torch: str  # the host's torch this was built for, "2.11.0+cu130"
    fbgemm: str  # "fbgemm-gpu==1.6.0"
    torchrec: str  # "torchrec==1.6.1"
    requirements: list  # the requirements.txt lines carried
    archive_sha256: str

    @classmethod
    def read(cls, directory: str) -> "Wheelhouse":
        path = os.path.join(directory, MANIFEST)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise WheelhouseError(
                f"{path}: cannot read the wheelhouse's manifest ({e.strerror}): "
                "is this a directory `make wheelhouse` wrote?"
            ) from None
        document, version = JsonObject.versioned(data, path, "a wheelhouse manifest", WHEELHOUSE_VERSION)
        fields = {
            name: document.get(name, TEXT)
            for name in (
                "stack",
                "device",
                "cuda_variant",
                "gpu_arch",
                "python",
                "torch",
                "fbgemm",
                "torchrec",
                "archive_sha256",
            )
        }
        return cls(version=version, requirements=document.get("requirements", text_list()), **fields)


def stack_pins(stack: str, device: str, cuda_variant: str) -> dict[str, str]:
    """{"torch": "torch==2.11.0+cu130", "fbgemm": ..., "torchrec": ...} from stacks/STACK."""
    folder = os.path.join(REPO, "stacks", stack)
    if not os.path.isfile(os.path.join(folder, "cuda-variants")):
        raise WheelhouseError(f"--stack must be one of the folders of stacks/, not '{stack}'")
    pins: dict[str, str] = {}
    for name in (f"requirements-{device}.txt", "requirements-torchrec.txt"):
        with open(os.path.join(folder, name)) as f:
            for line in f:
                line = line.strip().replace("${CUDA_VARIANT}", cuda_variant)
                if line and not line.startswith("#"):
                    key = (
                        "torch"
                        if line.startswith("torch==")
                        else "torchrec"
                        if line.startswith("torchrec==")
                        else "fbgemm"
                    )
                    pins[key] = line
    return pins


def check_variant(stack: str, cuda_variant: str) -> str:
    """``cuda_variant``, or the stack's first when empty; one line when the stack has no such build."""
    path = os.path.join(REPO, "stacks", stack, "cuda-variants")
    if not os.path.isfile(path):
        raise WheelhouseError(f"--stack must be one of the folders of stacks/, not '{stack}'")
    with open(path) as f:
        variants = [line.split()[0] for line in f if re.fullmatch(r"cu\d+ \d+\n?", line)]
    if not cuda_variant:
        return variants[0]
    if cuda_variant not in variants:
        raise WheelhouseError(
            f"CUDA_VARIANT must be {' or '.join(variants)} for the {stack} stack, not '{cuda_variant}'"
        )
    return cuda_variant


def trimmed_pins(stack: str) -> list[tuple[str, str, str, str]]:
    """The stack's ``trimmed-wheels`` lines: (wheel file, arch, input sha256, output sha256)."""
    path = os.path.join(REPO, "stacks", stack, "trimmed-wheels")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [tuple(line.split()) for line in f if line.strip() and not line.startswith("#")]  # type: ignore[misc]


def carried_requirements(path: str, packages=WHEELHOUSE_PACKAGES) -> list[str]:
    """The lines of ``path`` (requirements.txt) naming one of ``packages``."""
    wanted = {name.lower() for name in packages}
    kept = []
    with open(path) as f:
        for line in f:
            line = line.split("#")[0].strip()
            name = re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0]
            if name.lower() in wanted:
                kept.append(line)
    missing = wanted - {re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower() for line in kept}
    if missing:
        raise WheelhouseError(f"{path} does not pin {', '.join(sorted(missing))}, which the wheelhouse carries")
    return kept


def stand_in_torch(directory: str, version: str) -> str:
    """A wheel named torch at ``version`` with no files and no dependencies: offered to
    pip's resolver so that the host's torch satisfies every ``torch`` requirement."""
    dist_info = f"torch-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: wheelhouse.py\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    path = os.path.join(directory, f"torch-{version}-py3-none-any.whl")
    record = []
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(text)}")
        wheel.writestr(f"{dist_info}/RECORD", "\n".join(record + [f"{dist_info}/RECORD,,"]) + "\n")
    return path


def _pip(args: list, log) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    return subprocess.run(command, capture_output=True, text=True)


def _target(python: str) -> list:
    flags = ["--python-version", python, "--only-binary=:all:"]
    for platform in PLATFORMS:
        flags += ["--platform", platform]
    return flags


def download(
    requirements: list, python: str, into: str, links: list, constraint: str, index: list, log, no_deps: bool = False
) -> None:
    """pip download for the target; a requirement with no wheel (only a source archive)
    is built into a pure-Python wheel in ``links[0]`` and the download retried."""
    for _ in range(20):
        args = ["download", "-q", *_target(python), "-d", into, "-c", constraint, *index]
        for link in links:
            args += ["--find-links", link]
        result = _pip(args + (["--no-deps"] if no_deps else []) + requirements, log)
        if result.returncode == 0:
            return
        missing = re.search(r"No matching distribution found for (\S+)", result.stderr)
        if not missing:
            raise WheelhouseError(f"pip download failed: {result.stderr.strip().splitlines()[-1]}")
        built = _pip(["wheel", "-q", "--no-deps", "-w", links[0], missing.group(1)], log)
        wheels = [
            w
            for w in os.listdir(links[0])
            if w.lower().startswith(re.split(r"[<>=!~]", missing.group(1))[0].lower().replace("-", "_"))
        ]
        if built.returncode != 0 or not wheels or not all(w.endswith("-py3-none-any.whl") for w in wheels):
            raise WheelhouseError(
                f"{missing.group(1)} has no wheel for Python {python} on manylinux x86_64 "
                "and does not build into a pure-Python one here"
            )
        log(f"wheelhouse: {missing.group(1)} is published as a source archive only: built {', '.join(wheels)}")
    raise WheelhouseError("pip download kept failing")


def build(
    stack: str,
    device: str,
    cuda_variant: str,
    gpu_arch: str,
    python: str,
    output: str,
    fbgemm_wheel: str = "",
    torch_index: str = "",
    max_mib: float = 60.0,
    requirements_path: str = os.path.join(REPO, "requirements.txt"),
    packages=WHEELHOUSE_PACKAGES,
    log=print,
) -> Wheelhouse:
    """Writes the wheelhouse into ``output`` (created; must be empty); returns its manifest."""
    if device == "cuda":
        cuda_variant = check_variant(stack, cuda_variant)
    pins = stack_pins(stack, device, cuda_variant if device == "cuda" else "")
    if device == "cpu":
        cuda_variant = gpu_arch = ""
    torch_version = pins["torch"].split("==", 1)[1]
    carried = carried_requirements(requirements_path, packages)
    os.makedirs(output, exist_ok=True)
    if os.listdir(output):
        raise WheelhouseError(f"{output} is not empty: give a new directory")
    index = ["--extra-index-url", torch_index] if torch_index else []
    fbgemm_pin = pins["fbgemm"]
    if device == "cuda" and not torch_index:
        fbgemm_pin = fbgemm_pin.split("+", 1)[0]  # PyPI's build has no label (the cu130 one)
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as work:
        links, wheels, fbgemm_dir = (os.path.join(work, name) for name in ("links", "wheels", "fbgemm"))
        for folder in (links, wheels, fbgemm_dir):
            os.makedirs(folder)
        stand_in_torch(links, torch_version)
        constraint = os.path.join(work, "constraints.txt")
        with open(constraint, "w") as f:
            f.write(f"torch=={torch_version}\n")
        # FBGEMM (a local wheel given: that one), trimmed to one architecture on CUDA.
        if fbgemm_wheel:
            shutil.copy(fbgemm_wheel, fbgemm_dir)
        else:
            log(f"wheelhouse: downloading {fbgemm_pin} for Python {python}")
            download([fbgemm_pin], python, fbgemm_dir, [links], constraint, index, log, no_deps=True)
        (downloaded,) = os.listdir(fbgemm_dir)
        source = os.path.join(fbgemm_dir, downloaded)
        if device == "cuda" and gpu_arch:
            source_sha = sha256_of(source)
            trimmed = trim_wheel(source, gpu_arch, wheels, log=log)
            trimmed_sha = sha256_of(trimmed)
            pinned = [p for p in trimmed_pins(stack) if p[0] == downloaded and p[1] == gpu_arch and p[2] == source_sha]
            if pinned and pinned[0][3] != trimmed_sha:
                raise WheelhouseError(
                    f"trimming {downloaded} to {gpu_arch} gave sha256 {trimmed_sha}, not the "
                    f"{pinned[0][3]} stacks/{stack}/trimmed-wheels pins"
                )
            log(
                f"wheelhouse: {downloaded} trimmed to {gpu_arch}: sha256 {trimmed_sha}"
                + (" (as pinned)" if pinned else f" (not pinned in stacks/{stack}/trimmed-wheels)")
            )
        else:
            shutil.move(source, wheels)
        log(f"wheelhouse: downloading {pins['torchrec']} and {len(carried)} runtime packages with their dependencies")
        download([pins["torchrec"]], python, wheels, [links], constraint, [], log, no_deps=True)
        download(carried + [BUILD_REQUIREMENT], python, wheels, [links], constraint, [], log)
        for name in os.listdir(wheels):
            if name.startswith("torch-"):  # the stand-in, which pip "downloads" too
                os.remove(os.path.join(wheels, name))
        archive = os.path.join(output, ARCHIVE)
        log(f"wheelhouse: compressing {len(os.listdir(wheels))} wheels into {archive}")
        _compress(wheels, archive)
    manifest = Wheelhouse(
        version=WHEELHOUSE_VERSION,
        stack=stack,
        device=device,
        cuda_variant=cuda_variant,
        gpu_arch=gpu_arch,
        python=python,
        torch=torch_version,
        fbgemm=fbgemm_pin.split("+", 1)[0] if device == "cuda" and not torch_index else fbgemm_pin,
        torchrec=pins["torchrec"],
        requirements=carried + [BUILD_REQUIREMENT],
        archive_sha256=sha256_of(archive),
    )
    with open(os.path.join(output, MANIFEST), "w") as f:
        json.dump(asdict(manifest), f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(output, name)) for name in os.listdir(output)) / 2**20
    if size > max_mib:
        raise WheelhouseError(f"{output} holds {size:.1f} MiB, over the {max_mib:g} MiB that can be carried")
    log(
        f"wheelhouse: {output}: {size:.1f} MiB for {stack} ({device}{' ' + cuda_variant if cuda_variant else ''}"
        f"{', ' + gpu_arch if gpu_arch else ''}), Python {python}, over torch {torch_version}"
    )
    return manifest


def store_members(wheel: str) -> None:
    """Rewrites ``wheel`` with its members stored, not deflated: xz then compresses their
    bytes (a third smaller than deflate's output for numpy's libraries). The RECORD's
    digests are of the members' contents and stay valid; the FBGEMM wheel the trim
    wrote is stored already."""
    with zipfile.ZipFile(wheel) as source:
        if all(info.compress_type == zipfile.ZIP_STORED for info in source.infolist()):
            return
        with zipfile.ZipFile(wheel + ".part", "w", zipfile.ZIP_STORED) as out:
            for info in source.infolist():
                member = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                member.external_attr = info.external_attr
                out.writestr(member, source.read(info.filename))
    os.replace(wheel + ".part", wheel)


def _compress(wheels: str, archive: str) -> None:
    """The wheels, their members stored, as one tar.xz: the `xz` program on all cores
    where there is one (the trimmed FBGEMM wheel is gigabytes, mostly zeros), else
    Python's lzma, both at preset 9 (a 64 MiB window: cubins repeat across libraries)."""
    names = sorted(os.listdir(wheels))
    for name in names:
        store_members(os.path.join(wheels, name))
    if shutil.which("xz") and shutil.which("tar"):
        with open(archive, "wb") as out:
            tar = subprocess.Popen(["tar", "-C", wheels, "-cf", "-", *names], stdout=subprocess.PIPE)
            xz = subprocess.run(["xz", "-T0", "-9", "-c"], stdin=tar.stdout, stdout=out)
            tar.stdout.close()  # type: ignore[union-attr]
            if tar.wait() != 0 or xz.returncode != 0:
                raise WheelhouseError(f"tar | xz failed writing {archive}")
        return
    with tarfile.open(archive, "w:xz", preset=9) as tar:
        for name in names:
            tar.add(os.path.join(wheels, name), arcname=name)


def unpack(directory: str, into: str) -> Wheelhouse:
    """Checks the archive's digest and extracts its wheels into ``into``."""
    manifest = Wheelhouse.read(directory)
    archive = os.path.join(directory, ARCHIVE)
    if not os.path.isfile(archive) or sha256_of(archive) != manifest.archive_sha256:
        raise WheelhouseError(
            f"{archive} is missing or not the archive {MANIFEST} describes (sha256 differs): "
            "copy the whole wheelhouse directory again"
        )
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(into, filter="data")
    return manifest


def main(argv=None) -> int:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="download, trim and compress into --output")
    make.add_argument("--stack", required=True, help="a folder of stacks/, e.g. torch2.11")
    make.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cuda",
        help="the stack's CUDA build (FBGEMM trimmed to --gpu-arch) or its CPU build",
    )
    make.add_argument("--cuda-variant", default="", help="one of the stack's cuda-variants (default: its first)")
    make.add_argument("--gpu-arch", default="", help="keep only this architecture's FBGEMM cubins, e.g. sm_90")
    make.add_argument("--python-version", default="3.12", help="the target host's Python, e.g. 3.12")
    make.add_argument("--output", required=True, help="a new or empty directory for the wheelhouse")
    make.add_argument("--fbgemm-wheel", default="", help="a downloaded FBGEMM wheel to use instead of downloading")
    make.add_argument("--torch-index", default="", help="an extra index for FBGEMM (PyTorch's); default PyPI only")
    make.add_argument("--max-mib", type=float, default=60.0, help="refuse a wheelhouse larger than this")
    make.add_argument(
        "--requirements",
        default=os.path.join(REPO, "requirements.txt"),
        help="where the carried packages' pins are read",
    )
    make.add_argument(
        "--packages",
        default=",".join(WHEELHOUSE_PACKAGES),
        help="the packages of --requirements to carry, comma-separated (default: what training imports)",
    )
    show = commands.add_parser("show", help="print a field of DIR's manifest (requirements: one a line)")
    show.add_argument("directory")
    show.add_argument("field", choices=sorted(Wheelhouse.__dataclass_fields__))
    extract = commands.add_parser("unpack", help="check DIR's archive and extract its wheels into INTO")
    extract.add_argument("directory")
    extract.add_argument("into")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build(
                args.stack,
                args.device,
                args.cuda_variant,
                args.gpu_arch,
                args.python_version,
                args.output,
                args.fbgemm_wheel,
                args.torch_index,
                args.max_mib,
                args.requirements,
                args.packages.split(","),
            )
        elif args.command == "show":
            value = getattr(Wheelhouse.read(args.directory), args.field)
            print("\n".join(value) if isinstance(value, list) else value)
        else:
            unpack(args.directory, args.into)
    except (WheelhouseError, TrimError, FileFieldError) as e:
        print(f"wheelhouse: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
