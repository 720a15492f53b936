"""The data floor: where the evaluation sets live (`datasets`), the verifiable task generators
(`parallel_tasks`), plain corpus reading and tokenising (`corpus`) and the stdlib corpus's
functions and docstrings read with `ast` (`stdlib`). Nothing here imports Lightning:
the runtime (a retrieval drafter's datastore), the benchmark and the training DataModules all read
data through this floor."""
