# The two commands of the README: `make run` and `make test`. Each installs
# what it needs first (idempotently).
GO ?= go
export CGO_ENABLED = 0
ARGS ?= doctor
# What `sandloop --version` says: the git description of this tree.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

.PHONY: run test build deps gen bench load test-vm image weed test-s3 test-images

deps:
	@./scripts/deps.sh

# The jail's small init, embedded into every binary that starts jails
# (internal/jail/initexe/README.md). Without it they re-execute themselves.
# The jail's join program, built with gcc (internal/jail/joinexe/README.md).
# Without it joins start the join script and the init. And a forked session's small reaper, built with gcc (internal/zygote/
# reaperexe/README.md). Without it the reaper stays a copy of the template.
gen:
	$(GO) generate ./internal/jail
	$(GO) generate ./internal/zygote

build: deps gen
	$(GO) build -ldflags "-X main.buildVersion=$(VERSION)" -o bin/sandloop ./cmd/sandloop

# make run ARGS='exec -c "print(1)"'
run: build
	./bin/sandloop $(ARGS)

# Then a smoke test of test-vm (one VM boot, a few tests on kernel 6.1 /
# cgroup v2, ~2-3 minutes); it skips, saying why, without the VM runner
# (../shared/vm) or QEMU.
test: deps gen weed
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt -l: these files need gofmt -w:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 25m ./...
	./scripts/test-vm.sh --smoke

# The packages that touch the kernel (jail, session, zygote) on Debian 12's
# kernel 6.1 with cgroup v2 only, in a QEMU VM (TCG: slow, ~15-30 minutes),
# as root and as an unprivileged user with a delegated cgroup. Needs the
# VM runner (SANDLOOP_VM=.../shared/vm/run.sh); VM_RUN=pattern for a subset.
test-vm: deps gen
	./scripts/test-vm.sh

# SeaweedFS's weed, the real S3 server the snapshot store's S3 tests start on
# loopback (internal/snapshot/s3_test.go), built from its Go module in a
# module of its own (its many dependencies stay out of go.mod). The first
# build takes minutes; the Go build cache makes the next ones quick. If it
# cannot be built, the S3 tests skip, saying so.
WEED := internal/snapshot/testdata/weed/bin/weed
weed:
	@[ -x $(WEED) ] || { echo "building SeaweedFS (weed) for the S3 tests"; cd internal/snapshot/testdata/weed && $(GO) build -o bin/weed github.com/seaweedfs/seaweedfs/weed; } || echo "note: weed could not be built: the S3 snapshot tests will skip"

# The snapshot store's suite against both backends, failing (not skipping)
# if the S3 server cannot be started.
test-s3: weed
	SANDLOOP_REQUIRE_S3=1 $(GO) test -count=1 -v -run . ./internal/snapshot

# Image templates from a real distribution (slow: a download and an unpack of
# ~150 MB, so not in make test): a Debian 13 root made with mmdebstrap from
# the archive apt uses here, imported as an OCI layout, runs its own Python
# 3.13 in a session, and the jail's attacks (TestAttacksFail) pass with it as
# the root (internal/template/image_debian_linux_test.go).
test-images: deps gen
	@command -v mmdebstrap >/dev/null || apt-get install -y mmdebstrap
	SANDLOOP_TEST_IMAGES=1 $(GO) test -count=1 -timeout 20m -v -run 'TestDebianTrixieImage' ./internal/template

# The container image of deploy/Dockerfile, built without a registry:
# mmdebstrap + podman import (installs both from apt if missing).
image: gen
	./scripts/image.sh

# Speed claims, each printed as a ratio against a baseline measured in the same run.
bench: deps gen
	$(GO) test -run '^$$' -bench ColdExec -benchtime 30x ./cmd/sandloop
	$(GO) test -run '^$$' -bench ServeDefault -benchtime 8x ./cmd/sandloop
	$(GO) test -run '^$$' -bench Reattach -benchtime 1x ./cmd/sandloop
	$(GO) test -run '^$$' -bench RestoreAfterDeath -benchtime 1x ./internal/session
	$(GO) test -run '^$$' -bench Execute -benchtime 5000x ./internal/session
	$(GO) test -run '^$$' -bench CreateExecute -benchtime 40x ./client
	$(GO) test -run '^$$' -bench Burst100 -benchtime 1x ./client
	$(GO) test -run '^$$' -bench SparesPerSecond -benchtime 1x ./internal/zygote
	$(GO) test -run '^$$' -bench CreateImportPandas -benchtime 10x ./internal/zygote
	$(GO) test -run '^$$' -bench SequentialCreates -benchtime 4x ./internal/session
	$(GO) test -run '^$$' -bench IdleMemory -benchtime 1x ./internal/zygote
	$(GO) test -run '^$$' -bench PauseResume -benchtime 50x ./internal/zygote
	SANDLOOP_BENCH_SESSIONS=500 $(GO) test -run '^$$' -bench PausedSessions -benchtime 1x ./internal/zygote
	$(GO) test -run '^$$' -bench GatewayExecute -benchtime 2000x ./internal/gateway
	$(GO) test -run '^$$' -bench SessionsPerSecond -benchtime 1x ./internal/gateway
	$(GO) test -run '^$$' -bench E2BCreateRunCode -benchtime 1x ./cmd/sandloop
	$(GO) test -run '^$$' -bench E2BComputeSDK -benchtime 1x ./cmd/sandloop
	$(GO) test -run '^$$' -bench E2BBurst100 -benchtime 1x ./cmd/sandloop
	$(GO) test -run '^$$' -bench JoinStages -benchtime 20x ./internal/jail
	$(GO) test -run '^$$' -bench MCPBurst -benchtime 1x ./cmd/sandloop
	$(GO) test -run '^$$' -bench GatewayBurst -benchtime 1x ./internal/gateway
	$(GO) test -run '^$$' -bench Lessons -benchtime 1x ./internal/lessons
	$(GO) test -run '^$$' -bench Snapshot -benchtime 3x ./internal/snapshot
	$(GO) test -run '^$$' -bench Egress -benchtime 5x ./internal/egress
	$(GO) test -run '^$$' -bench WheelCache -benchtime 3x ./internal/session
	$(GO) test -run '^$$' -bench CreateAllow -benchtime 10x ./internal/session
	$(GO) test -run '^$$' -bench Checkpoint -benchtime 20x ./internal/workspace
	$(GO) test -run '^$$' -bench CheckpointSession -benchtime 20x ./internal/session
	$(GO) test -run '^$$' -bench UndoSession -benchtime 20x ./internal/session
	$(GO) test -run '^$$' -bench '^BenchmarkFork$$' -benchtime 5x ./internal/session
	$(GO) test -run '^$$' -bench SessionSnapshot -benchtime 3x ./internal/session
	$(GO) test -run '^$$' -bench TemplateSession -benchtime 1x ./internal/template
	$(GO) test -run '^$$' -bench TemplateBuildFromCache -benchtime 1x ./internal/template

# Proof under load: 50 clients for 2 minutes, then leak checks; issue 26's
# sustained creation (100/s offered for 30 s, --max-sessions 2000, the old
# pipeline beside) and 2,000 idle pandas sessions (memory per session),
# each with the same leak checks.
load: deps gen
	$(GO) run ./bench/load -duration 2m -clients 50
	$(GO) run ./bench/load -mode sustain -duration 30s -max-sessions 2000
	$(GO) run ./bench/load -mode idle -max-sessions 2000
	SANDLOOP_SOAK_CYCLES=1000 $(GO) test -count=1 -timeout 3h -run '^TestHibernateSoak$$' ./internal/session
