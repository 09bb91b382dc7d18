"""`infergen chat`: chat with the model through its chat template, interactively or `--once`."""

from __future__ import annotations

import argparse
import sys

from infergen.cli.common import add_sampling_args, load_llm, sampling_params
from infergen.engine.options import add_engine_args


def add_parser(sub) -> None:
    chat = sub.add_parser("chat", help="chat with the model using its chat template")
    add_engine_args(chat, "chat")
    add_sampling_args(chat)
    chat.add_argument("--system", default=None, help="system message")
    chat.add_argument(
        "--once",
        default=None,
        metavar="MESSAGE",
        help="send one message, print the reply and exit (non-interactive)",
    )
    chat.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    llm = load_llm(args)
    conversation: list[dict[str, str]] = []
    if args.system:
        conversation.append({"role": "system", "content": args.system})

    def turn(message: str) -> None:
        conversation.append({"role": "user", "content": message})
        prompt = llm.chat_prompt(conversation)
        sys.stdout.write("assistant> ")
        reply = []
        for delta in llm.stream(prompt, params):
            sys.stdout.write(delta.text)
            sys.stdout.flush()
            reply.append(delta.text)
        sys.stdout.write("\n")
        conversation.append({"role": "assistant", "content": "".join(reply)})

    if args.once is not None:
        print(f"user> {args.once}")
        turn(args.once)
        return 0
    print(
        "chat: type a message, an empty line or Ctrl-D to quit, /reset to start over",
        file=sys.stderr,
    )
    while True:
        try:
            message = input("user> ")
        except EOFError:
            break
        if not message.strip():
            break
        if message.strip() == "/reset":
            del conversation[1 if args.system else 0 :]
            continue
        turn(message)
    return 0
