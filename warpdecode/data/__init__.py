"""The data floor: where the evaluation sets live (`datasets`), the verifiable task generators
(`parallel_tasks`) and plain corpus reading and tokenising (`corpus`). Nothing here imports Lightning:
the runtime (a retrieval drafter's datastore), the benchmark and the training DataModules all read
data through this floor."""
