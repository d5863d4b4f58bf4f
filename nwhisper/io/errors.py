"""The error every audio reader raises for input that is not decodable audio."""


class AudioError(ValueError):
    """Input that is not decodable audio: the message names the input and what is wrong."""

    def __init__(self, name, problem):
        self.name = name
        self.problem = problem
        super().__init__(f"{name}: {problem}")
