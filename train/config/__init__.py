"""One typed config per run: a preset plus overrides (`--set key=value`, YAML/JSON files).

- `schema`: the dataclasses (a leaf: it imports no domain);
- `presets`: the named presets; `overrides`: a config made from a preset, files and overrides;
- `keys`: one dotted key set on a section; `yaml_format`: YAML as configs read and write it;
- `checks`: the values a run can use; `limits`: input limits outside a run;
- `migrations`: configs saved by older runs; `table`: the README's presets table.

Notebooks use `triskele.train.make_config` and `triskele.train.config_from_dict`.
"""
