import { useState } from "react";
import type { PendingInput } from "../model/view";

export function Clarification({
  pending,
  onAnswer,
}: {
  pending: PendingInput;
  onAnswer: (answer: string, option?: string) => void;
}) {
  const [text, setText] = useState("");
  return (
    <section
      aria-label="The agent asks"
      className="m-3 rounded border border-amber-400 bg-amber-950 p-3 text-amber-50"
    >
      <p className="mb-2 font-medium">{pending.question}</p>
      <div className="flex flex-wrap gap-2">
        {pending.options.map((option) => (
          <button
            type="button"
            key={option}
            className="rounded bg-amber-700 px-2 py-1 text-white hover:bg-amber-600"
            onClick={() => onAnswer(option, option)}
          >
            {option}
          </button>
        ))}
      </div>
      <form
        className="mt-2 flex gap-2"
        onSubmit={(e) => {
          e.preventDefault();
          if (text.trim()) onAnswer(text.trim());
        }}
      >
        <label className="sr-only" htmlFor="answer">
          Your answer
        </label>
        <input
          id="answer"
          className="flex-1 rounded border border-amber-600 bg-slate-900 p-1 text-slate-100"
          value={text}
          onChange={(e) => setText(e.target.value)}
          placeholder="Your answer"
        />
        <button type="submit" className="rounded bg-amber-700 px-2 py-1 text-white">
          Answer
        </button>
      </form>
    </section>
  );
}
