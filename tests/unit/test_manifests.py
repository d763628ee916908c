"""The Kubernetes manifests under docker/ against the images they run, without a cluster.

Every YAML file under docker/ is parsed; every pod template in it (an MPIJob's replicas, a Trainer
runtime's replicated jobs, with a TrainJob's trainer fields laid over the launcher) is checked
against facts read from the repository, not restated here: the entrypoint's modes, its sshd port and
key folder (docker/entrypoint.sh), the image tags the make targets build (Makefile), and the
Dockerfile each tag is built from (its ENTRYPOINT, EXPOSEd port, and the files it copies to
/opt/hvdtrain). Every `hvdtrain recipe ...` a manifest runs is parsed by the real command line
(`--keys`: the config is loaded and validated, nothing trains). Each check is also shown to catch
a broken copy of the manifest.
"""

from __future__ import annotations

import copy
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hvdtrain.cli import main as hvdtrain_cli

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
MANIFESTS = sorted(p for p in DOCKER.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
OPERATOR_KEY_FILE = "id_rsa"  # the name both the MPI Operator and Trainer give the job's private key
MPIJOB = ("kubeflow.org/v2beta1", "MPIJob")
RUNTIMES = {("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"),
            ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime")}
TRAINJOB = ("trainer.kubeflow.org/v1alpha1", "TrainJob")
TRAINER_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"


# --- facts about the images, read from the repository ----------------------------------------------

def _dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    steps, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        pending += " " + (stripped[:-1] if stripped.endswith("\\") else stripped)
        if not stripped.endswith("\\"):
            keyword, _, args = pending.strip().partition(" ")
            steps.append((keyword.upper(), " ".join(args.split())))
            pending = ""
    return steps


@dataclass
class Image:
    """What a manifest may rely on in one image."""

    tag: str
    dockerfile: Path
    entrypoint: list[str]
    exposed: set[int]
    frameworks: set[str]  # those its Horovod is built for


@dataclass
class Entrypoint:
    """docker/entrypoint.sh: the programs it runs as given, its sshd port and key folder."""

    passthrough: set[str]
    ssh_port: int
    keys_dir: str
    identities: list[str]


def entrypoint_facts() -> Entrypoint:
    text = (DOCKER / "entrypoint.sh").read_text()
    case = re.search(r'^\s*([\w|/*]+)\)\s*exec "\$@"', text, re.M)
    port = re.search(r'^port="\$\{HVDTRAIN_SSH_PORT:-(\d+)\}"', text, re.M)
    keys = re.search(r'^keys="\$\{HVDTRAIN_SSH_KEYS:-([^}]+)\}"', text, re.M)
    names = re.search(r"^for name in ([\w ]+); do", text, re.M)
    assert case and port and keys and names, "docker/entrypoint.sh changed shape: update this test's reader"
    return Entrypoint(set(case.group(1).split("|")), int(port.group(1)), keys.group(1), names.group(1).split())


def image_tags() -> dict[str, Image]:
    """Tag (hvdtrain:cpu, ...) -> the image its make target builds."""
    makefile = (REPO / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+) \?= (\S+)$", makefile, re.M))
    images = {}
    for target, recipe in re.findall(r"^(docker-\w+):.*\n\t(.+)$", makefile, re.M):
        words = shlex.split(recipe)
        assert words[:2] == ["bash", "scripts/docker-build.sh"], f"make {target}: {recipe}"
        dockerfile = words[words.index("-f") + 1] if "-f" in words else "docker/Dockerfile.cpu"
        tag = re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], words[-1])
        steps = _dockerfile_instructions(REPO / dockerfile)
        entry = yaml.safe_load(next(args for keyword, args in steps if keyword == "ENTRYPOINT"))
        exposed = {int(port) for keyword, args in steps if keyword == "EXPOSE" for port in args.split()}
        runs = " ".join(args for keyword, args in steps if keyword == "RUN")
        frameworks = {name for name in ("torch", "tensorflow")
                      if f"HOROVOD_WITHOUT_{'PYTORCH' if name == 'torch' else 'TENSORFLOW'}=1" not in runs}
        images[tag] = Image(tag, REPO / dockerfile, entry, exposed, frameworks)
    return images


def in_image(path: str, image: Image) -> bool:
    """Whether PATH exists in the image: /opt/hvdtrain is the repository (COPY --from=sources)."""
    steps = _dockerfile_instructions(image.dockerfile)
    assert ("COPY", "--from=sources /src /opt/hvdtrain") in steps, image.dockerfile
    if path.startswith("/opt/hvdtrain/.venv/"):
        return True  # made by the install step
    return path.startswith("/opt/hvdtrain/") and (REPO / path[len("/opt/hvdtrain/"):]).exists()


# --- the pods of a manifest --------------------------------------------------------------------------

@dataclass
class Pod:
    """One pod template: its role (launcher or worker), spec, and where it came from."""

    name: str
    role: str  # "launcher" | "worker"
    spec: dict
    runs_ranks: bool

    @property
    def container(self) -> dict:
        return self.spec["containers"][0]


def load_documents() -> list[tuple[Path, dict]]:
    docs = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path, doc))
    return docs


def pods_of(doc: dict, runtimes: dict[str, dict]) -> list[Pod]:
    """The pod templates one document makes, launcher first."""
    kind = (doc.get("apiVersion"), doc.get("kind"))
    if kind == MPIJOB:
        replicas = doc["spec"]["mpiReplicaSpecs"]
        return [Pod("Launcher", "launcher", replicas["Launcher"]["template"]["spec"], False),
                Pod("Worker", "worker", replicas["Worker"]["template"]["spec"], True)]
    if kind in RUNTIMES:
        pods, as_node = [], bool(doc["spec"]["mlPolicy"]["mpi"].get("runLauncherAsNode"))
        for job in doc["spec"]["template"]["spec"]["replicatedJobs"]:
            labels = job["template"].get("metadata", {}).get("labels", {})
            launcher = labels.get(TRAINER_ANCESTOR) == "trainer"
            pods.append(Pod(job["name"], "launcher" if launcher else "worker",
                            job["template"]["spec"]["template"]["spec"], as_node or not launcher))
        return sorted(pods, key=lambda pod: pod.role != "launcher")
    if kind == TRAINJOB:
        runtime = runtimes[doc["spec"]["runtimeRef"]["name"]]
        pods = copy.deepcopy(pods_of(runtime, runtimes))
        trainer = doc["spec"].get("trainer", {})
        for pod in pods:  # Trainer lays the TrainJob's trainer fields over the launcher's `node` container
            if pod.role == "launcher":
                pod.container.update({key: trainer[key] for key in ("image", "command", "args") if key in trainer})
            if pod.runs_ranks and "resourcesPerNode" in trainer:
                pod.container["resources"] = trainer["resourcesPerNode"]
        return pods
    return []


def slots_per_pod(doc: dict, runtimes: dict[str, dict]) -> int:
    if (doc["apiVersion"], doc["kind"]) == MPIJOB:
        return int(doc["spec"].get("slotsPerWorker", 1))
    runtime = runtimes[doc["spec"]["runtimeRef"]["name"]]
    return int(doc["spec"].get("trainer", {}).get("numProcPerNode")
               or runtime["spec"]["mlPolicy"]["mpi"].get("numProcPerNode", 1))


# --- the checks: each returns the problems it finds ------------------------------------------------

def split_mpirun(args: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """mpirun's options (name -> values) and the program it runs with its arguments."""
    takes_value = {"-np", "-n", "--bind-to", "--map-by", "-x", "--hostfile", "-H", "--host", "--mca", "-mca"}
    options: dict[str, list[str]] = {}
    i = 1
    while i < len(args) and args[i].startswith("-"):
        name = args[i]
        if name in ("--mca", "-mca"):
            options.setdefault(f"mca:{args[i + 1]}", []).append(args[i + 2])
            i += 3
        elif name in takes_value:
            options.setdefault(name, []).append(args[i + 1])
            i += 2
        else:
            options.setdefault(name, [])
            i += 1
    return options, args[i:]


def check_command(pod: Pod, images: dict[str, Image], entry: Entrypoint) -> list[str]:
    """The container goes through the image's entrypoint and asks it for a mode it has."""
    problems, container = [], pod.container
    command, args = container.get("command"), container.get("args") or []
    image = images.get(container["image"].rsplit("/", 1)[-1])
    if image is None:
        return [f"{pod.name}: image {container['image']!r} is none of the images make builds ({sorted(images)})"]
    if command and command != image.entrypoint[-len(command):]:
        problems.append(f"{pod.name}: command {command} replaces the image's entrypoint {image.entrypoint}")
    if not args:
        problems.append(f"{pod.name}: no args (the entrypoint would only print help)")
        return problems
    first = args[0]
    commands = set(hvdtrain_cli.commands)
    absolute = "/*" in entry.passthrough and first.startswith("/")  # a program given by its path
    if not (first == "worker" or first in entry.passthrough or absolute or first in commands):
        problems.append(f"{pod.name}: {first!r} is no mode of docker/entrypoint.sh "
                        f"(worker, {', '.join(sorted(entry.passthrough))}, or an hvdtrain command: {sorted(commands)})")
    for value in _strings(pod.spec):
        if value.startswith("/opt/hvdtrain") and not in_image(value, image):
            problems.append(f"{pod.name}: {value} does not exist in {image.tag}")
    return problems


def hvdtrain_args(args: list[str]) -> list[str] | None:
    """The arguments of the `hvdtrain` a container runs (directly or under mpirun), or None."""
    if args and args[0] == "mpirun":
        args = split_mpirun(args)[1]
    if args and args[0] == "hvdtrain":
        return args[1:]
    if args and args[0] in hvdtrain_cli.commands:
        return args
    return None


def check_recipe(pod: Pod, images: dict[str, Image]) -> list[str]:
    """The hvdtrain command line parses with the real CLI and its config loads (--keys: no training);
    its framework is one the image's Horovod is built for."""
    args = hvdtrain_args(pod.container.get("args") or [])
    if not args or args[0] != "recipe":
        return []
    result = CliRunner().invoke(hvdtrain_cli, [*args, "--keys"])
    if result.exit_code != 0:
        return [f"{pod.name}: `hvdtrain {' '.join(args)}` fails: {result.output.strip().splitlines()[-1:]}"]
    framework = re.search(r"^\s*framework = '(\w+)'", result.output, re.M).group(1)
    image = images.get(pod.container["image"].rsplit("/", 1)[-1])
    if image and framework not in image.frameworks:
        return [f"{pod.name}: {image.tag} has no {framework} (its Horovod: {sorted(image.frameworks)})"]
    return []


def check_paths(pod: Pod, rank_pods: list[Pod]) -> list[str]:
    """--data/--output/--config of the recipe lie on volumes every rank's pod mounts."""
    args = hvdtrain_args(pod.container.get("args") or []) or []
    problems = []
    for flag in ("--data", "--output", "--config"):
        if flag not in args:
            continue
        path = args[args.index(flag) + 1]
        for rank_pod in rank_pods:
            mounts = [m["mountPath"] for m in rank_pod.container.get("volumeMounts", [])]
            if not any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts):
                problems.append(f"{rank_pod.name}: {flag} {path} is on no volume it mounts ({mounts})")
    return problems


def sshd_port(pod: Pod, entry: Entrypoint) -> int:
    env = {e["name"]: e.get("value") for e in pod.container.get("env", [])}
    return int(env.get("HVDTRAIN_SSH_PORT", entry.ssh_port))


def check_ssh(policy: dict, pods: list[Pod], images: dict[str, Image], entry: Entrypoint) -> list[str]:
    """POLICY: the MPIJob, or the TrainJob's runtime. Workers run sshd and are Ready only once it listens; the launcher's ssh goes to that port;
    the job's key pair is mounted where the entrypoint looks for it, under a name it takes."""
    problems = []
    workers = [pod for pod in pods if (pod.container.get("args") or [None])[0] == "worker"]
    launchers = [pod for pod in pods if pod.role == "launcher"]
    if not workers:
        problems.append("no pod runs the entrypoint's `worker` mode (sshd)")
    for pod in workers:
        port = sshd_port(pod, entry)
        image = images.get(pod.container["image"].rsplit("/", 1)[-1])
        if image and port not in image.exposed:
            problems.append(f"{pod.name}: sshd port {port} is not the port {image.tag} exposes ({image.exposed})")
        probe = pod.container.get("readinessProbe") or {}
        if "exec" not in probe and (probe.get("tcpSocket") or {}).get("port") != port:
            problems.append(f"{pod.name}: no readinessProbe on sshd's port {port} ({probe or 'none'})")
        for launcher in launchers:
            args = launcher.container.get("args") or []
            if args[:1] != ["mpirun"]:
                continue
            rsh = shlex.split(" ".join(split_mpirun(args)[0].get("mca:plm_rsh_args", [])))
            ssh_port = int(rsh[rsh.index("-p") + 1]) if "-p" in rsh else 22
            if ssh_port != port:
                problems.append(f"{launcher.name}: mpirun's ssh goes to port {ssh_port}, {pod.name}'s sshd listens on {port}")
    if (policy["apiVersion"], policy["kind"]) == MPIJOB:
        mount = policy["spec"].get("sshAuthMountPath", "/root/.ssh")
    else:
        mount = policy["spec"]["mlPolicy"]["mpi"].get("sshAuthMountPath", "/root/.ssh")
    if mount != entry.keys_dir:
        problems.append(f"sshAuthMountPath {mount} is not where docker/entrypoint.sh reads the key pair ({entry.keys_dir})")
    if OPERATOR_KEY_FILE not in entry.identities:
        problems.append(f"docker/entrypoint.sh takes none of the operator's key file {OPERATOR_KEY_FILE}")
    return problems


def check_start_order(doc: dict, pods: list[Pod]) -> list[str]:
    """The launcher starts only once every worker is Ready (DOC: the MPIJob, or the TrainJob's runtime)."""
    if (doc["apiVersion"], doc["kind"]) == MPIJOB:
        policy = doc["spec"].get("launcherCreationPolicy", "AtStartup")
        return [] if policy == "WaitForWorkersReady" else [f"launcherCreationPolicy is {policy}, not WaitForWorkersReady"]
    problems = []
    jobs = {job["name"]: job for job in doc["spec"]["template"]["spec"]["replicatedJobs"]}
    for pod in pods:
        if pod.role == "launcher":
            waits = {d["name"]: d["status"] for d in jobs[pod.name].get("dependsOn", [])}
            for worker in (p for p in pods if p.role == "worker"):
                if waits.get(worker.name) != "Ready":
                    problems.append(f"replicated job {pod.name} does not wait for {worker.name} to be Ready ({waits})")
    if not doc["spec"]["template"]["spec"].get("network", {}).get("publishNotReadyAddresses"):
        problems.append("network.publishNotReadyAddresses is not set (the hostfile's names resolve only for Ready pods)")
    return problems


def check_resources(doc: dict, pods: list[Pod], runtimes: dict[str, dict]) -> list[str]:
    """One rank per GPU: a rank pod's GPUs equal its slots, and GPUs only with the GPU image."""
    problems, slots = [], slots_per_pod(doc, runtimes)
    for pod in pods:
        gpus = int(((pod.container.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
        if pod.runs_ranks and gpus and gpus != slots:
            problems.append(f"{pod.name}: {gpus} GPU(s) for {slots} slot(s)")
        if gpus and not pod.container["image"].endswith(":gpu"):
            problems.append(f"{pod.name}: GPUs with the image {pod.container['image']}")
    images = {pod.container["image"] for pod in pods}
    if len(images) != 1:
        problems.append(f"the pods run different images: {sorted(images)}")
    return problems


def check_document(doc: dict, runtimes: dict[str, dict], images: dict[str, Image], entry: Entrypoint) -> list[str]:
    """Every problem of one Kubernetes document (MPIJob or TrainJob; runtimes through their jobs)."""
    pods = pods_of(doc, runtimes)
    problems = []
    for pod in pods:
        problems += check_command(pod, images, entry) + check_recipe(pod, images)
        problems += check_paths(pod, [p for p in pods if p.runs_ranks])
    policy = runtimes[_runtime_name(doc)] if _runtime_name(doc) else doc  # the MPIJob, or the TrainJob's runtime
    problems += check_ssh(policy, pods, images, entry) + check_start_order(policy, pods)
    problems += check_resources(doc, pods, runtimes)
    return problems


def _runtime_name(doc: dict) -> str | None:
    return doc["spec"]["runtimeRef"]["name"] if (doc.get("apiVersion"), doc.get("kind")) == TRAINJOB else None


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


# --- tests ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def world():
    docs = [(path, doc) for path, doc in load_documents() if isinstance(doc, dict)]
    runtimes = {doc["metadata"]["name"]: doc for _, doc in docs if (doc.get("apiVersion"), doc.get("kind")) in RUNTIMES}
    jobs = [doc for _, doc in docs if (doc.get("apiVersion"), doc.get("kind")) in (MPIJOB, TRAINJOB)]
    return docs, runtimes, jobs, image_tags(), entrypoint_facts()


def test_every_manifest_parses_and_is_a_known_kind(world):
    docs, _, jobs, _, _ = world
    assert {p.name for p in MANIFESTS} >= {"mpijob.yaml", "trainjob.yaml"}
    known = {MPIJOB, TRAINJOB, *RUNTIMES}
    for path, doc in docs:  # a Kubernetes object of another kind needs its checks here first
        if isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc:
            assert (doc["apiVersion"], doc["kind"]) in known, f"{path}: {doc['apiVersion']} {doc['kind']}"
    assert {(doc["apiVersion"], doc["kind"]) for doc in jobs} == {MPIJOB, TRAINJOB}


def test_the_images_the_manifests_name_are_the_ones_make_builds(world):
    _, _, _, images, entry = world
    assert {"hvdtrain:cpu", "hvdtrain:gpu"} <= set(images)
    assert images["hvdtrain:cpu"].frameworks == {"torch", "tensorflow"} and images["hvdtrain:gpu"].frameworks == {"torch"}
    for image in images.values():
        assert image.entrypoint[-1] == "/opt/hvdtrain/docker/entrypoint.sh" and in_image(image.entrypoint[-1], image)
        assert entry.ssh_port in image.exposed, image


@pytest.mark.parametrize("name", ["hvdtrain-imagenet"])
def test_jobs_run_what_the_image_has(world, name):
    docs, runtimes, _, images, entry = world
    checked = 0
    for path, doc in docs:
        if (doc.get("apiVersion"), doc.get("kind")) in (MPIJOB, TRAINJOB):
            assert doc["metadata"]["name"] == name
            assert check_document(doc, runtimes, images, entry) == [], path
            checked += 1
    assert checked == 2


def test_both_jobs_train_the_same_recipe(world):
    _, runtimes, jobs, _, _ = world
    commands = []
    for doc in jobs:
        launcher = next(pod for pod in pods_of(doc, runtimes) if pod.role == "launcher")
        commands.append(hvdtrain_args(launcher.container["args"]))
    assert commands[0] == commands[1] and commands[0][:2] == ["recipe", "image-classification"]
    assert commands[0][commands[0].index("--resume") + 1] == "auto"  # a resubmitted job continues


def _broken(world, kind, change):
    _, runtimes, jobs, images, entry = world
    doc = copy.deepcopy(next(d for d in jobs if (d["apiVersion"], d["kind"]) == kind))
    runtimes = copy.deepcopy(runtimes)
    change(doc, runtimes)
    return " | ".join(check_document(doc, runtimes, images, entry))


def _launcher_args(doc, runtimes):
    if doc["kind"] == "MPIJob":
        return doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
    return doc["spec"]["trainer"]["args"]


def _worker(doc, runtimes):
    if doc["kind"] == "MPIJob":
        return doc["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    jobs = runtimes[doc["spec"]["runtimeRef"]["name"]]["spec"]["template"]["spec"]["replicatedJobs"]
    return next(j for j in jobs if j["name"] == "node")["template"]["spec"]["template"]["spec"]["containers"][0]


def _set(args, flag, value):
    args[args.index(flag) + 1] = value


BREAKAGES = {
    "sshd port": (lambda d, r: _worker(d, r).setdefault("env", []).append({"name": "HVDTRAIN_SSH_PORT", "value": "22"}),
                  "mpirun's ssh goes to port 2222"),
    "no probe": (lambda d, r: _worker(d, r).pop("readinessProbe"), "no readinessProbe on sshd's port 2222"),
    "probe port": (lambda d, r: _worker(d, r)["readinessProbe"]["tcpSocket"].update(port=22),
                   "no readinessProbe on sshd's port 2222"),
    "rsh port": (lambda d, r: _set(_launcher_args(d, r), "plm_rsh_args", "-o ConnectionAttempts=10"),
                 "mpirun's ssh goes to port 22,"),
    "bad key": (lambda d, r: _launcher_args(d, r).extend(["--set", "model.nme=resnet50"]),
                "unknown config key model.nme"),
    "bad value": (lambda d, r: _set(_launcher_args(d, r), "--epochs", "many"), "'many' is not a valid integer"),
    "bad mode": (lambda d, r: _worker(d, r).update(args=["sshd"]), "'sshd' is no mode of docker/entrypoint.sh"),
    "entrypoint replaced": (lambda d, r: _worker(d, r).update(command=["/usr/sbin/sshd", "-De"]),
                            "replaces the image's entrypoint"),
    "image tag": (lambda d, r: _worker(d, r).update(image="registry.example.com/hvdtrain:cuda"),
                  "none of the images make builds"),
    "path in image": (lambda d, r: _worker(d, r).update(args=["bash", "/opt/hvdtrain/docker/start-worker.sh"]),
                      "/opt/hvdtrain/docker/start-worker.sh does not exist in hvdtrain:gpu"),
    "framework": (lambda d, r: _set(_launcher_args(d, r), "--framework", "tensorflow"),
                  "hvdtrain:gpu has no tensorflow"),
    "output off the volume": (lambda d, r: _set(_launcher_args(d, r), "--output", "/runs/imagenet"),
                              "--output /runs/imagenet is on no volume"),
}


@pytest.mark.parametrize("kind", [MPIJOB, TRAINJOB], ids=["mpijob", "trainjob"])
@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_checks_catch_a_broken_manifest(world, kind, breakage):
    change, expected = BREAKAGES[breakage]
    assert expected in _broken(world, kind, change)


def test_start_order_checks_catch_a_launcher_that_does_not_wait(world):
    def mpijob(doc, runtimes):
        doc["spec"].pop("launcherCreationPolicy")

    def trainjob(doc, runtimes):
        jobs = runtimes[doc["spec"]["runtimeRef"]["name"]]["spec"]["template"]["spec"]["replicatedJobs"]
        next(j for j in jobs if j["name"] == "launcher").pop("dependsOn")

    def keys(doc, runtimes):
        runtimes[doc["spec"]["runtimeRef"]["name"]]["spec"]["mlPolicy"]["mpi"]["sshAuthMountPath"] = "/root/.ssh"

    assert "launcherCreationPolicy is AtStartup" in _broken(world, MPIJOB, mpijob)
    assert "does not wait for node to be Ready" in _broken(world, TRAINJOB, trainjob)
    assert "sshAuthMountPath /root/.ssh is not where docker/entrypoint.sh reads" in _broken(world, TRAINJOB, keys)


def test_resource_checks_catch_gpus_that_do_not_match_the_ranks(world):
    def mpijob(doc, runtimes):
        doc["spec"]["slotsPerWorker"] = 8

    def trainjob(doc, runtimes):
        doc["spec"]["trainer"]["image"] = "registry.example.com/hvdtrain:cpu"

    assert "4 GPU(s) for 8 slot(s)" in _broken(world, MPIJOB, mpijob)
    broken = _broken(world, TRAINJOB, trainjob)
    assert "GPUs with the image registry.example.com/hvdtrain:cpu" in broken and "different images" in broken
