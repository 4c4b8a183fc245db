"""A data error names the file and the offset: the same on every rank, so restarting cannot help."""

from workers.model_io import UserModelError


class DataError(UserModelError):
    def __init__(self, path: str, offset: int | str, problem: str):
        super().__init__(f"data: {path} at offset {offset}: {problem}")
        self.path, self.offset = path, offset
