"""The start-up baseline: a Typer app that does nothing."""

import typer

app = typer.Typer()


@app.command()
def main(version: bool = typer.Option(False, "--version")) -> None:
    if version:
        print("minimal 0")


if __name__ == "__main__":
    app()
