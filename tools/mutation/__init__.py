"""The mutation harness: one-line bugs the tests must catch (`mutant_list`), applied and run (`harness`)."""
