# The two commands of the README: `make run` and `make test`. Each installs
# what it needs first (idempotently).
GO ?= go
export CGO_ENABLED = 0
ARGS ?= doctor

.PHONY: run test build deps bench

deps:
	@./scripts/deps.sh

build: deps
	$(GO) build -o bin/sandloop ./cmd/sandloop

# make run ARGS='exec -c "print(1)"'
run: build
	./bin/sandloop $(ARGS)

test: deps
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 25m ./...

bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 30x ./cmd/sandloop
