"""A command's config before anything runs: composed as Hydra composes it (`compose`), every `_target_` and
resolver allow-listed (`targets`), every value typed and checked (`schema`), every path it writes checked
(`writes`). The YAML files themselves live in `mhalab/conf/`."""
