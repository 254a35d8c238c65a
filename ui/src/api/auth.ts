// The development token lives in sessionStorage: it survives a reload of the tab but not the
// browser, and never goes to localStorage or a cookie where other tabs or requests would see it.
const KEY = "fleet.token";

export function loadToken(): string | null {
  try {
    return sessionStorage.getItem(KEY);
  } catch {
    return null;
  }
}

export function saveToken(token: string | null): void {
  try {
    if (token) sessionStorage.setItem(KEY, token);
    else sessionStorage.removeItem(KEY);
  } catch {
    // storage refused (private mode): the token stays in memory for this page only
  }
}
