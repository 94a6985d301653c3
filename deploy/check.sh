#!/usr/bin/env bash
# Checks the deployment files without Docker or a cluster (CI runs it; well under 2 minutes
# with a warm Go cache):
#   1. every YAML file (compose, Kubernetes, Helm values, Prometheus, Grafana provisioning)
#      and every JSON file (the dashboard) parses, and holds what the fleet relies on
#      (replicas, NATS URLs, grace periods, probes, the KEDA stream and consumer, the
#      dashboard's and the alerts' metrics exist in internal/worker/metrics.go, ...);
#   2. the Helm values grant the same per-role permissions as deploy/nats/auth.conf, and
#      .dockerignore and .gitignore keep out deploy/.env and the files made for Secrets;
#   3. each NATS node config loads in nats-server -t (nats-server built from the module cache);
#   4. deploy/build.sh, the Dockerfile's build step, builds the three static binaries;
#   5. `promtool check config` and `promtool test rules` (alerts_test.yml), with promtool from
#      Debian's prometheus package (installed when missing, about 10 s);
#   6. deploy/chaos.sh refuses to start while one of its fixed ports is served (another drill);
#   7. `docker compose config`, when the compose plugin is installed (it needs no engine).
# The permissions themselves are exercised by internal/cluster's TestNATSConfigPermissions.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
step() { printf -- '--- deploy/check.sh: %s (%ss)\n' "$*" "$(( $(date +%s) - start ))"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

step "YAML and JSON parse and say what the fleet needs"
if ! python3 -c 'import yaml' 2>/dev/null; then
	echo "python3-yaml is missing; installing it (Debian package python3-yaml)"
	if [ "$(id -u)" = 0 ]; then apt-get install -y -qq python3-yaml >/dev/null || { apt-get update -qq && apt-get install -y -qq python3-yaml >/dev/null; }
	else sudo apt-get install -y -qq python3-yaml >/dev/null; fi
fi
python3 - <<'PY'
import glob, json, re, sys
import yaml

errors = []
def check(cond, msg):
    if not cond:
        errors.append(msg)

docs = {}
for path in sorted(glob.glob("deploy/**/*.y*ml", recursive=True)):
    try:
        docs[path] = [d for d in yaml.safe_load_all(open(path)) if d is not None]
    except yaml.YAMLError as e:
        errors.append(f"{path}: {e}")
jsons = {}
for path in sorted(glob.glob("deploy/**/*.json", recursive=True)):
    try:
        jsons[path] = json.load(open(path))
    except ValueError as e:
        errors.append(f"{path}: {e}")
print(f"parsed {len(docs)} YAML and {len(jsons)} JSON files")
if errors:
    sys.exit("\n".join(errors))

# The NATS servers a deployment runs are the release every test runs: go.mod's.
nats_release = re.search(r"github.com/nats-io/nats-server/v2 v(\S+)", open("go.mod").read()).group(1)

def k8s_bytes(q):
    """A Kubernetes (or compose: 1g) memory quantity in bytes."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|K|M|G|T|b|m|g)?", str(q))
    mult = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "K": 10**3,
            "M": 10**6, "G": 10**9, "T": 10**12, "b": 1, "m": 1 << 20, "g": 1 << 30}
    return int(m.group(1)) * mult[m.group(2)] if m else None

def gomemlimit_bytes(v):
    """GOMEMLIMIT in bytes: plain bytes or B, KiB, MiB, GiB, TiB (Go takes no other suffix)."""
    m = re.fullmatch(r"(\d+)(B|KiB|MiB|GiB|TiB)?", str(v))
    return int(m.group(1)) << {None: 0, "B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[m.group(2)] if m else None

def headroom(what, gomemlimit, limit, lo, hi):
    """GOMEMLIMIT leaves the memory Go does not count (the kernel's, the runtime's overshoot)."""
    g, l = gomemlimit_bytes(gomemlimit), k8s_bytes(limit)
    check(g is not None and l and lo <= g / l <= hi,
          f"{what}: GOMEMLIMIT {gomemlimit} under a memory limit of {limit} (want {lo:.0%} to {hi:.0%} of it, in Go's units B, KiB, MiB, GiB)")

def dur(s):
    m = re.fullmatch(r"(\d+)s", str(s))
    return int(m.group(1)) if m else None

# The image's Go is go.mod's: the golang image sets GOTOOLCHAIN=local, so one older than the
# go line fails to build ("go.mod requires go >= ..."), and a floating tag (golang:1.26) is
# whatever release the builder last pulled.
go_release = re.search(r"^go (\S+)$", open("go.mod").read(), re.M).group(1)
froms = re.findall(r"^FROM\s+(?:--platform=\S+\s+)?golang:(\S+)", open("deploy/Dockerfile").read(), re.M)
check(froms and all(t.split("-")[0].split("@")[0] == go_release for t in froms),
      f"Dockerfile: build image golang:{', '.join(froms) or '?'} (want golang:{go_release}, go.mod's go line)")

# compose: three NATS nodes, three workers reaching all of them, R3 streams, a grace
# period longer than the workers' own.
c = docs["deploy/compose.yaml"][0]["services"]
for n in (1, 2, 3):
    s = c.get(f"nats-{n}")
    check(s is not None, f"compose: no service nats-{n}")
    if s:
        check(s["image"] == f"nats:{nats_release}-alpine", f"compose: nats-{n} image {s['image']} (want nats:{nats_release}-alpine, go.mod's release)")
        check(f"/etc/nats/nats-{n}.conf" in s["command"], f"compose: nats-{n} does not load nats-{n}.conf")
w = c["worker"]
env = w["environment"]
check(w["deploy"]["replicas"] == 3, "compose: worker replicas != 3")
check(all(f"nats://nats-{n}:4222" in env["NATS_URL"] for n in (1, 2, 3)), "compose: worker NATS_URL misses a node")
check(env["TINKERFLEET_REPLICAS"] == "3", "compose: TINKERFLEET_REPLICAS != 3")
check(env["NATS_USER"] == "worker", "compose: workers must connect as the worker user")
headroom("compose: worker", env.get("GOMEMLIMIT"), w["deploy"]["resources"]["limits"]["memory"], 0.80, 0.95)
check(c["submit"]["environment"]["NATS_USER"] == "submit", "compose: submit must connect as the submit user")
check(dur(w["stop_grace_period"]) > dur(env["TINKERFLEET_SHUTDOWN_GRACE"]), "compose: worker stop_grace_period must exceed the shutdown grace")
check(int(env["TINKERFLEET_MAX_ACK_PENDING"]) == 3 * int(env["TINKERFLEET_CONCURRENCY"]), "compose: MaxAckPending != workers x concurrency")
check("TINKER_API_KEY" not in env and env.get("TINKER_API_KEY_FILE"), "compose: the key must come from a secret file")
# A tokenizer in a gated HuggingFace repository needs a token: HF_TOKEN of the host, empty
# (no token, as the tokenizer package reads it) when unset. Where `compose run submit` loads
# tokenizers (--dry-run, tokenize) too.
for name, e in (("worker", env), ("submit", c["submit"]["environment"])):
    check(e.get("HF_TOKEN") in ("${HF_TOKEN:-}", "${HF_TOKEN-}"), f"compose: {name} must take HF_TOKEN from the host, as HF_TOKEN: ${{HF_TOKEN:-}} (empty when unset: no token)")
# The workers' tokenizer cache is a named volume that 65532 can write: mounted on the image
# user's home, whose owner a new volume takes (one on a path the image lacks is root's). In
# the container's own layer, every recreated worker downloaded its tokenizers again.
named = {v.split(":")[1]: v.split(":")[0] for v in w.get("volumes", []) if v.split(":")[0] in docs["deploy/compose.yaml"][0].get("volumes", {})}
hf_home = env.get("HF_HOME", "")
check(re.search(r"^FROM gcr\.io/distroless/\S+:nonroot$", open("deploy/Dockerfile").read(), re.M),
      "Dockerfile: the image is no longer distroless's nonroot, whose /home/nonroot (65532's) compose mounts the workers' tokenizer cache on")
check(any(m == "/home/nonroot" and hf_home.startswith(m + "/") for m in named),
      f"compose: worker HF_HOME {hf_home or '(unset)'} must be under a named volume mounted on /home/nonroot (the image user's home)")
check(c["submit"]["environment"].get("HF_HOME", "").startswith("/work/"),
      "compose: submit runs as a user the image does not know (HOME is /, not writable): its HF_HOME must be under the mounted checkout, /work")

# prometheus scrapes the workers and the exporters
p = docs["deploy/prometheus/prometheus.yml"][0]
jobs = {j["job_name"]: j for j in p["scrape_configs"]}
check("tinkerfleet-worker" in jobs and "nats" in jobs, "prometheus: needs the tinkerfleet-worker and nats jobs")
check(jobs["tinkerfleet-worker"]["dns_sd_configs"][0]["port"] == 9464, "prometheus: workers serve metrics on 9464")

# grafana provisioning
ds = docs["deploy/grafana/provisioning/datasources/prometheus.yaml"][0]["datasources"][0]
check(ds["uid"] == "prometheus" and ds["type"] == "prometheus", "grafana: datasource uid/type")
check(docs["deploy/grafana/provisioning/dashboards/tinkerfleet.yaml"][0]["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards", "grafana: dashboard path")

# the dashboard: the five views, and every tinkerfleet_* metric it uses exists
dash = jsons["deploy/grafana/dashboards/tinkerfleet.json"]
exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
alltext = "\n".join(exprs)
for need in ("rate(tinkerfleet_jobs_finished_total", "histogram_quantile(", "tinkerfleet_job_duration_seconds_bucket",
             "tinkerfleet_dispatch_", "tinkerfleet_backoff_active", "tinkerfleet_tinker_rate_limited_total",
             "jetstream_consumer_num_pending", "tinkerfleet_results_held"):
    check(need in alltext, f"dashboard: no panel uses {need}")
defined = set(re.findall(r'Name:\s*"(tinkerfleet_[a-z_]+)"', open("internal/worker/metrics.go").read()))
defined |= set(re.findall(r'gauge\("(tinkerfleet_[a-z_]+)"', open("internal/worker/metrics.go").read()))
for m in set(re.findall(r"tinkerfleet_[a-z_]+", alltext)):
    base = re.sub(r"_(bucket|sum|count)$", "", m)
    check(m in defined or base in defined or m == "tinkerfleet_dispatch_", f"dashboard: metric {m} is not defined in internal/worker/metrics.go")

# the alerts: loaded, each complete, every tinkerfleet_* metric they use exists
check(docs["deploy/prometheus/prometheus.yml"][0].get("rule_files") == ["alerts.yml"], "prometheus: rule_files must load alerts.yml")
alerts = docs["deploy/prometheus/alerts.yml"][0]["groups"][0]["rules"]
for r in alerts:
    check(all(k in r for k in ("alert", "expr", "labels", "annotations")) and r["labels"].get("severity") in ("critical", "warning"),
          f"alerts: {r.get('alert')} lacks alert, expr, a severity or annotations")
    for m in set(re.findall(r"tinkerfleet_[a-z_]+", r["expr"])):
        check(m in defined, f"alerts: {r['alert']} uses {m}, which internal/worker/metrics.go does not define")
check({"TinkerfleetBacklogWithoutWorkers", "TinkerfleetResultsHeld"} <= {r["alert"] for r in alerts}, "alerts: the backlog-without-workers and results-held alerts are missing")
check(all(p.get("datasource", {}).get("uid", "prometheus") == "prometheus" for p in dash["panels"] if p["type"] != "row"), "dashboard: panels must use the provisioned datasource")

# Kubernetes
k = {}
for path, ds_ in docs.items():
    if path.startswith("deploy/k8s/") and not path.endswith("nats-values.yaml"):
        for d in ds_:
            check("apiVersion" in d and "kind" in d, f"{path}: a document without apiVersion/kind")
            k.setdefault(d["kind"], []).append(d)
dep = k["Deployment"][0]["spec"]["template"]["spec"]
ctr = dep["containers"][0]
cenv = {e["name"]: e.get("value") for e in ctr["env"]}
check(dep["terminationGracePeriodSeconds"] > dur(cenv["TINKERFLEET_SHUTDOWN_GRACE"]), "k8s: terminationGracePeriodSeconds must exceed --shutdown-grace")
check(ctr["livenessProbe"]["httpGet"]["path"] == "/healthz" and ctr["readinessProbe"]["httpGet"]["path"] == "/readyz", "k8s: probes")
check("requests" in ctr["resources"] and "limits" in ctr["resources"], "k8s: resources")
# A moving tag must be pulled at every start: with IfNotPresent, a node that holds an older
# image of the tag runs it after a rollout, and the fleet mixes releases unseen.
tag = ctr["image"].rsplit("/", 1)[-1].partition(":")[2] if "@" not in ctr["image"] else "digest"
check(tag not in ("", "latest") or ctr.get("imagePullPolicy", "Always") == "Always",
      f"k8s: image {ctr['image']} is a moving tag: pull it Always (Kubernetes' default for it), not {ctr.get('imagePullPolicy')}")
# A fixed value: resourceFieldRef can pass the limit itself (no headroom) or the limit over a
# divisor without its unit ("1024" for 1Gi over 1Mi, which Go reads as 1024 bytes), never 90%.
headroom("k8s: worker", cenv.get("GOMEMLIMIT"), ctr["resources"]["limits"]["memory"], 0.80, 0.95)
check(cenv.get("TINKER_API_KEY_FILE") and "TINKER_API_KEY" not in cenv, "k8s: the key must be a mounted file")
mounts = {m["mountPath"] for m in ctr["volumeMounts"]}
check(any(cenv["TINKER_API_KEY_FILE"].startswith(m + "/") for m in mounts), "k8s: TINKER_API_KEY_FILE is not on a mounted volume")
check(any(cenv["NATS_NKEY"].startswith(m + "/") for m in mounts), "k8s: NATS_NKEY is not on a mounted volume")
check(dep["securityContext"]["runAsUser"] == 65532, "k8s: run as 65532")
secrets = {s["metadata"]["name"] for s in k["Secret"]}
for v in dep["volumes"]:
    if "secret" in v and not v["secret"].get("optional"):
        check(v["secret"]["secretName"] in secrets, f"k8s: volume {v['name']} uses an undefined secret")
if "HF_TOKEN_PATH" in cenv:
    check(any(cenv["HF_TOKEN_PATH"].startswith(m + "/") for m in mounts), "k8s: HF_TOKEN_PATH is not on a mounted volume")
so = k["ScaledObject"][0]["spec"]
trig = so["triggers"][0]
check(trig["type"] == "nats-jetstream", "keda: trigger type")
check(trig["metadata"]["stream"] == "TINKERFLEET_JOBS" and trig["metadata"]["consumer"] == "workers", "keda: stream/consumer")
check(so["scaleTargetRef"]["name"] == k["Deployment"][0]["metadata"]["name"], "keda: scale target")
# KEDA owns the replica count: a spec.replicas in the manifest is applied over it at every
# `kubectl apply` (a new image, a changed flag), stopping all workers but that many mid-batch.
check("replicas" not in k["Deployment"][0]["spec"], "k8s: the Deployment KEDA scales must not set spec.replicas (kubectl apply would reset KEDA's count to it)")
check(int(cenv["TINKERFLEET_MAX_ACK_PENDING"]) >= so["maxReplicaCount"] * int(cenv["TINKERFLEET_CONCURRENCY"]), "k8s: MaxAckPending below maxReplicaCount x concurrency")

# Helm values: cluster of 3, JetStream file store, and the permissions of auth.conf
hv = docs["deploy/k8s/nats-values.yaml"][0]
check(hv["config"]["cluster"]["enabled"] and hv["config"]["cluster"]["replicas"] == 3, "helm: cluster of 3")
check(hv["config"]["jetstream"]["enabled"] and hv["config"]["jetstream"]["fileStore"]["enabled"], "helm: JetStream file store")
# nats-server without GOMEMLIMIT lets its heap grow to twice what is live (the duplicate
# window and the results' subject index, deploy/README.md): killed at half its limit.
headroom("helm: nats container", hv["container"].get("env", {}).get("GOMEMLIMIT"),
         hv["container"]["merge"]["resources"]["limits"]["memory"], 0.70, 0.90)
check(hv["container"]["image"]["tag"] == f"{nats_release}-alpine", f"helm: nats image tag {hv['container']['image']['tag']} (want {nats_release}-alpine, go.mod's release)")
conf = open("deploy/nats/auth.conf").read()
def conf_perms(name):
    i = conf.index(name + " = {"); j = conf.index("{", i); depth = 0
    for e in range(j, len(conf)):
        depth += {"{": 1, "}": -1}.get(conf[e], 0)
        if depth == 0:
            break
    body = re.sub(r"#[^\n]*", "", conf[j:e + 1])
    out = {}
    for sec in ("publish", "subscribe"):
        s = re.search(sec + r": \{(.*?)\n  \}", body, re.S).group(1)
        out[sec] = {kind: sorted(re.findall(r'"([^"]+)"', m.group(1)))
                    for kind in ("allow", "deny") if (m := re.search(kind + r": \[(.*?)\]", s, re.S))}
    if re.search(r"\n  allow_responses: true\n", body):
        out["allow_responses"] = True
    return out
users = hv["config"]["merge"]["authorization"]["users"]
# Each user is known by its permissions, not its nkey: the README has the real public keys
# replace the placeholders.
roles = {role: conf_perms(role + "_PERMISSIONS") for role in ("WORKER", "SUBMIT")}
found = set()
for i, u in enumerate(users):
    if "permissions" in u:
        perms = {sec: d if isinstance(d, bool) else {kind: sorted(v) for kind, v in d.items()}
                 for sec, d in u["permissions"].items()}
        matched = [role for role, want in roles.items() if perms == want]
        check(matched, f"helm: the permissions of user {i + 1} match neither the worker's nor submit's in deploy/nats/auth.conf")
        found.update(matched)
for role in roles:
    check(role in found, f"helm: no user has the {role.lower()} permissions of deploy/nats/auth.conf")

if errors:
    sys.exit("deploy check failed:\n  " + "\n  ".join(errors))
print("manifests hold together")
PY

step "the image's build context and git leave out deploy/.env, the Secrets' files and the checkout's run output"
for kept_out in .env '**/.env' tinker-api-key '*.nk' '*.creds' .tinkerfleet worker submit; do
	grep -qxF -- "$kept_out" .dockerignore || { echo ".dockerignore does not keep out $kept_out" >&2; exit 1; }
done
# Every file the deploy README and secrets.yaml have one create in the checkout for a Secret
# (kubectl create secret … --from-file=KEY=./FILE) stays out of the build context and of git.
for made in $(grep -rhoE -- '--from-file=[^= ]+=\./[A-Za-z0-9._-]+' deploy/README.md deploy/k8s | sed 's/.*=\.\///' | sort -u); do
	kept=
	while IFS= read -r pat; do
		[[ -z $pat || $pat == '#'* || $pat == '!'* ]] && continue
		# shellcheck disable=SC2053 # the pattern is a glob on purpose
		[[ $made == $pat ]] && kept=1
	done <.dockerignore
	[ -n "$kept" ] || { echo ".dockerignore does not keep out ./$made, the file deploy/README.md has one create for a Secret" >&2; exit 1; }
	if git rev-parse --git-dir >/dev/null 2>&1 && ! git check-ignore -q --no-index -- "$made"; then
		echo ".gitignore does not keep out ./$made, the file deploy/README.md has one create for a Secret" >&2
		exit 1
	fi
done

step "NATS configs load (nats-server -t)"
go build -o "$tmp/nats-server" github.com/nats-io/nats-server/v2
for n in 1 2 3; do
	NATS_ADMIN_PASSWORD=check-admin NATS_SUBMIT_PASSWORD=check-submit NATS_WORKER_PASSWORD=check-worker \
		"$tmp/nats-server" -t -c "deploy/nats/nats-$n.conf" 2>&1
done

step "the image's build step outside Docker (deploy/build.sh)"
deploy/build.sh "$tmp/bin"
usage=$("$tmp/bin/worker" -h 2>&1 || true)
grep -q -- '-nats-url' <<<"$usage" || { echo "the built worker does not run: $usage" >&2; exit 1; }

if ! command -v promtool >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
	echo "promtool is missing; installing it (Debian package prometheus, without recommends)"
	sudo=()
	[ "$(id -u)" = 0 ] || sudo=(sudo -n)
	install=("${sudo[@]}" apt-get install -y -qq --no-install-recommends prometheus)
	"${install[@]}" >/dev/null 2>&1 || { "${sudo[@]}" apt-get update -qq >/dev/null 2>&1 && "${install[@]}" >/dev/null 2>&1; } || true
fi
if command -v promtool >/dev/null 2>&1; then
	step "Prometheus config, alerts and their unit tests (promtool)"
	promtool check config deploy/prometheus/prometheus.yml
	promtool test rules deploy/prometheus/alerts_test.yml
else
	step "promtool could not be installed: alerts.yml checked by the parser above only"
fi

step "deploy/chaos.sh refuses to start where one of its ports is already served"
# As another drill on this machine would serve them: 18765 is held here when it is free.
holder=
if ! (exec 3<>/dev/tcp/127.0.0.1/18765) 2>/dev/null; then
	python3 -c 'import socket, time; s = socket.socket(); s.bind(("127.0.0.1", 18765)); s.listen(); time.sleep(120)' &
	holder=$!
	for _ in $(seq 100); do # until it listens: a slow start would let the drill run
		! (exec 3<>/dev/tcp/127.0.0.1/18765) 2>/dev/null || break
		sleep 0.1
	done
fi
rc=0
out=$(timeout -s INT 60 deploy/chaos.sh 3 2>&1) || rc=$?
[ -z "$holder" ] || kill "$holder" 2>/dev/null || true
if [ "$rc" != 1 ] || ! grep -q 'already served' <<<"$out"; then
	printf 'deploy/chaos.sh did not refuse a port already served (status %s):\n%s\n' "$rc" "$out" >&2
	exit 1
fi

if docker compose version >/dev/null 2>&1; then
	step "docker compose config"
	docker compose -f deploy/compose.yaml --env-file deploy/.env.example config -q
else
	step "docker compose plugin not installed: compose.yaml checked by the parser above only"
fi
step "ok"
