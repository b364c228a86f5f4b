"""Stage 2, the validator: is a token log what schema v1 says, and can its numbers be trusted?
`files` (one file's rules), `call` (the checks across the files of a call), `sequences` (duplicate rows, pos
gaps, resumes), `audit` (columns shifted by a token), `facts` (the token identity a file carries),
`evidence` and `findings` (the data-driven findings per run), `report` (terminal and JSON).

May import: the base modules (`errors`, `problems`, `sources`, `text_table`), `evaluator.formulas` and
`schemas`."""

from evaluator.validate.call import (
    Validation,
    find_parquet_files,
    judge_call,
    require_readable,
    validate_paths,
)
from evaluator.validate.files import CheckedFile, check_file, validate_file

__all__ = [
    "CheckedFile",
    "Validation",
    "check_file",
    "find_parquet_files",
    "judge_call",
    "require_readable",
    "validate_file",
    "validate_paths",
]
