"""manifest.json for the Python tools: the functions, ISAs, schedule sources, shape classes
and the hand-written schedule's parameters, with the lists derived from them. The build
reads the same file (cmake/AttnManifest.cmake); nothing here parses CMake or C++.

    import manifest
    m = manifest.load()
    m.variants()                 # [("autotuned", "sse41"), ...], manifest order
    m.function("attention_layer")["generator"]
"""
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATH = ROOT / "manifest.json"

# The fused layer's functions come from this generator; every other generator is one stage's.
LAYER_GENERATOR = "attention_layer"


class Manifest:
    def __init__(self, data):
        self.data = data
        self.functions = {f["name"]: f for f in data["functions"]}
        self.isas = {i["name"]: i for i in data["isas"]}
        self.sources = {s["name"]: s for s in data["schedule_sources"]}
        self.shape_classes = {c["name"]: c for c in data["shape_classes"]["classes"]}
        self.manual_parameters = {p["name"]: p for p in data["manual_parameters"]}
        self._check()

    def _check(self):
        for isa in self.isas.values():
            for source in isa["variants"]:
                if source not in self.sources:
                    raise ValueError(f"manifest.json: ISA {isa['name']}: unknown schedule source {source!r}")
        for source in self.sources.values():
            for where, functions in source.get("not_provided", {}).items():
                if where != "all" and where not in self.isas:
                    raise ValueError(f"manifest.json: {source['name']}: not_provided names unknown ISA {where!r}")
                for f in functions:
                    if f not in self.functions:
                        raise ValueError(f"manifest.json: {source['name']}: not_provided names unknown function {f!r}")
        generators = {f["generator"] for f in self.functions.values()}
        for f in self.functions.values():
            if f.get("tuned_with", f["generator"]) not in generators:
                raise ValueError(f"manifest.json: {f['name']}: tuned_with names unknown generator {f['tuned_with']!r}")
            for p in f["manual_parameters"]:
                if p not in self.manual_parameters:
                    raise ValueError(f"manifest.json: {f['name']}: unknown manual parameter {p!r}")

    def function(self, name):
        return self.functions[name]

    def generator_params(self, function):
        """The function's own generator params, as key=value arguments."""
        return [f"{k}={v}" for k, v in self.functions[function]["params"].items()]

    def functions_of_generator(self, generator):
        return [name for name, f in self.functions.items() if f["generator"] == generator]

    def functions_tuned_with(self, generator):
        """The functions a tuning of the generator's parameters serves: its own, and those of
        other generators that run the same schedule code (tuned_with)."""
        return [name for name, f in self.functions.items() if f.get("tuned_with", f["generator"]) == generator]

    def fused(self, function):
        """Whether the function is of the fused layer's family: the layer generator's functions
        and those tuned with it (attention_core, its flash core alone), which share the
        autoscheduler limits of fused_layer_params."""
        return function in self.functions_tuned_with(LAYER_GENERATOR)

    def packed_twin(self, function):
        """The function of the same generator and params computing packed sequences, or None."""
        f = self.functions[function]
        if f["params"].get("packed") == "true":
            return None
        want = {**f["params"], "packed": "true"}
        return next((name for name, g in self.functions.items()
                     if g["generator"] == f["generator"] and g["params"] == want), None)

    def stage_functions(self):
        """The functions of the five stages (every generator but the fused layer's)."""
        return [name for name, f in self.functions.items() if f["generator"] != LAYER_GENERATOR]

    def layer_functions(self):
        return self.functions_of_generator(LAYER_GENERATOR)

    def variants(self, kind=None):
        """(source, ISA) of every variant, in manifest order; only sources of `kind` if given."""
        return [(s, i) for i, isa in self.isas.items() for s in isa["variants"]
                if kind is None or self.sources[s]["kind"] == kind]

    def provides(self, source, isa, function):
        not_provided = self.sources[source].get("not_provided", {})
        return function not in not_provided.get("all", []) + not_provided.get(isa, [])

    def is_gpu(self, isa):
        return self.isas[isa]["device"] != "cpu"

    def target(self, isa):
        return self.isas[isa]["halide_target"]

    def autoscheduler_params(self, source, isa, function):
        """key=value parameters of the source's autoscheduler on the ISA's device, for the function."""
        s = self.sources[source]
        params = dict(s.get("autoscheduler_params", {}).get("gpu" if self.is_gpu(isa) else "cpu", {}))
        if self.fused(function):
            params.update(s.get("fused_layer_params", {}))
        return params

    def autoschedulers(self):
        """The sources an autoscheduler makes (frozen or run in process)."""
        return [name for name, s in self.sources.items() if s.get("autoscheduler")]

    def frozen_isas(self, source):
        """The ISAs with a variant of the frozen source, as the frozen schedules are kept: an ISA
        that reuses another's (frozen_schedules_of) counts as that one."""
        isas = [self.isas[i].get("frozen_schedules_of", i) for s, i in self.variants("frozen") if s == source]
        return list(dict.fromkeys(isas))

    def manual_defaults(self):
        return {name: p["default"] for name, p in self.manual_parameters.items()}


def load(path=PATH):
    return Manifest(json.loads(pathlib.Path(path).read_text()))
