"""The markdown table every bench prints (header row, separator, one row per result)."""


def print_markdown_table(head: tuple[str, ...] | list[str], body: list) -> None:
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]

    def line(cells) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    print(line(head))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for b in body:
        print(line(b))
