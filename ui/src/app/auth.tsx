import { createContext, type ReactNode, useContext, useMemo, useState } from "react";
import { loadToken, saveToken } from "../api/auth";
import { Api } from "../api/http";

interface Auth {
  api: Api | null;
  signIn: (token: string) => void;
  signOut: () => void;
}

const Ctx = createContext<Auth>({ api: null, signIn: () => {}, signOut: () => {} });

export function AuthProvider({ children }: { children: ReactNode }) {
  const [token, setToken] = useState<string | null>(loadToken);
  const value = useMemo<Auth>(
    () => ({
      api: token ? new Api(token) : null,
      signIn: (t) => {
        saveToken(t);
        setToken(t);
      },
      signOut: () => {
        saveToken(null);
        setToken(null);
      },
    }),
    [token],
  );
  return <Ctx.Provider value={value}>{children}</Ctx.Provider>;
}

export const useAuth = () => useContext(Ctx);
